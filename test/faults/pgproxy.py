#!/usr/bin/env python3
"""pgproxy: a PostgreSQL-protocol-aware fault-injection TCP proxy for tests.

    pgproxy.py serve --listen-port N --upstream-host H --upstream-port P --control SOCKPATH
    pgproxy.py ctl SOCKPATH 'COMMAND'

serve listens on 127.0.0.1:N (N = 0: a free port), prints exactly one line
"ready PORT" on stdout once it listens, and runs until SIGTERM or SIGINT.
Every client connection gets its own upstream connection to H:P, or, when H
starts with "/", to the Unix socket H/.s.PGSQL.P.

Control: one line command per connection on the Unix socket SOCKPATH, one
line answer starting with "ok" or "error". `ctl` sends one command, prints
the answer and exits 0 on "ok" (1 on "error", 2 when the proxy cannot be
reached). Arguments are split like a shell would (shlex), so a SUBSTRING
with spaces can be quoted. Commands:

  drop-reply SUBSTRING COUNT      the next COUNT calls whose SQL contains
                                  SUBSTRING: forward the call, read the whole
                                  reply up to and including ReadyForQuery,
                                  discard it, close the client's and the
                                  server's sockets
  delay-reply SUBSTRING MS COUNT  hold the reply to the next COUNT matching
                                  calls for MS milliseconds (from its
                                  ReadyForQuery on), then forward it
  drop-fraction SUBSTRING P SEED  drop (as drop-reply) the reply to each
                                  matching call with probability P, drawn
                                  from random.Random(SEED), until clear
  reset                           close every open connection, both sides,
                                  at once (SO_LINGER 0: an RST on TCP)
  clear                           remove every rule
  stats                           ok connections=N dropped=N delayed=N calls=N
                                  (then, added: open=N matched=N resets=N
                                  cancels=N parses=N rules=N)
  rules                           (added) the rules in force, one "ok" line
  ping                            (added) ok

Rules are tried in the order they were added; the first one that matches a
call and fires decides (a drop-fraction rule whose draw says "no" lets the
later rules try). A counted rule is removed once it has fired COUNT times.

What the proxy understands of the protocol (v3):
  * startup: SSLRequest and GSSENCRequest are answered 'N' (no encryption);
    CancelRequest is forwarded to the upstream on a connection of its own;
    the StartupMessage opens the upstream connection. Authentication passes
    through untouched.
  * a "call" is what ends with one ReadyForQuery ('Z') from the server: a
    simple Query ('Q'), a FunctionCall ('F'), or everything the client sent
    from one Sync ('S') to the next in the extended protocol. The proxy keeps
    a first-in first-out list of the calls in flight, so pipelined calls
    (several Query or Sync messages before the first reply) keep working and
    each reply is matched with its call.
  * the SQL of a call is what it executes: the text of a Query, and for each
    Execute ('E') the text of the statement its portal was bound to. Parse
    ('P') records statement name -> SQL per connection (the unnamed one too)
    and Bind ('B') portal -> SQL, so a named prepared statement that is only
    bound and executed (psycopg 3 after 5 executions, node-pg, ruby-pg
    exec_prepared) still matches. A Parse without an Execute (a bare
    PQprepare) runs nothing and is not matched. Close ('C') forgets a name.
  * a matched call's reply is held until its ReadyForQuery; a
    CopyInResponse or CopyBothResponse in it (the server waits for the
    client) releases it at once and unmatches the call. If the server closes
    the connection in the middle of a held reply (e.g. a terminated backend's
    FATAL), what it sent is forwarded and nothing counts as dropped.

Python 3 standard library only (asyncio). Listens on 127.0.0.1 only.
"""

import argparse
import asyncio
import collections
import os
import random
import shlex
import signal
import socket
import struct
import sys

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP = 10000


class Rule:
    def __init__(self, kind, substring, count=None, ms=0, p=0.0, seed=None):
        self.kind = kind            # 'drop', 'delay', 'fraction'
        self.substring = substring
        self.count = count          # None: until clear
        self.ms = ms
        self.p = p
        self.seed = seed
        self.rng = random.Random(seed) if kind == 'fraction' else None
        self.fired = 0

    def describe(self):
        if self.kind == 'drop':
            return 'drop-reply %s %d (fired %d)' % (shlex.quote(self.substring), self.count, self.fired)
        if self.kind == 'delay':
            return 'delay-reply %s %d %d (fired %d)' % (shlex.quote(self.substring), self.ms, self.count, self.fired)
        return 'drop-fraction %s %g %s (fired %d)' % (shlex.quote(self.substring), self.p, self.seed, self.fired)


class Call:
    __slots__ = ('texts', 'action', 'held')

    def __init__(self, texts, action):
        self.texts = texts
        self.action = action        # None, ('drop',), ('delay', ms)
        self.held = bytearray()


def cstring(body, pos):
    end = body.index(b'\0', pos)
    return body[pos:end].decode('utf-8', 'replace'), end + 1


def linger0(writer):
    """SO_LINGER {on, 0}: close() then sends an RST instead of a FIN (TCP)."""
    if writer is None:
        return
    sock = writer.get_extra_info('socket')
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    except OSError:
        pass


class Conn:
    """One client connection and its upstream connection."""

    def __init__(self, proxy, cr, cw):
        self.proxy = proxy
        self.cr, self.cw = cr, cw
        self.sr = self.sw = None
        self.statements = {}
        self.portals = {}
        self.pending = []           # SQL executed since the last Sync
        self.calls = collections.deque()
        self.closed = False

    # -- closing -------------------------------------------------------------
    def close(self):
        if self.closed:
            return
        self.closed = True
        for w in (self.cw, self.sw):
            if w is not None:
                try:
                    w.close()
                except Exception:
                    pass

    def abort(self):
        """Both sides at once, RST where the socket is TCP."""
        if self.closed:
            return
        self.closed = True
        for w in (self.cw, self.sw):
            if w is not None:
                linger0(w)
                try:
                    w.transport.abort()
                except Exception:
                    pass

    # -- client side ---------------------------------------------------------
    async def read_startup(self):
        """The startup packet, after answering SSL/GSSENC requests with 'N'.
        Returns the packet, or None when the connection was a cancel request."""
        while True:
            head = await self.cr.readexactly(4)
            (length,) = struct.unpack('!I', head)
            if length < 8 or length > MAX_STARTUP:
                raise ConnectionError('bad startup packet length %d' % length)
            body = await self.cr.readexactly(length - 4)
            (code,) = struct.unpack('!I', body[:4])
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                self.cw.write(b'N')
                await self.cw.drain()
                continue
            if code == CANCEL_REQUEST:
                self.proxy.cancels += 1
                r, w = await self.proxy.open_upstream()
                w.write(head + body)
                await w.drain()
                try:
                    await asyncio.wait_for(r.read(), 5)
                except (asyncio.TimeoutError, ConnectionError):
                    pass
                w.close()
                return None
            return head + body

    def on_client_message(self, t, body):
        if t == 0x51:                                   # 'Q'
            self.push_call([body[:-1].decode('utf-8', 'replace')])
        elif t == 0x50:                                 # 'P' Parse
            name, pos = cstring(body, 0)
            sql, _ = cstring(body, pos)
            self.statements[name] = sql
            self.proxy.parses += 1
        elif t == 0x42:                                 # 'B' Bind
            portal, pos = cstring(body, 0)
            stmt, _ = cstring(body, pos)
            self.portals[portal] = self.statements.get(stmt, '')
        elif t == 0x45:                                 # 'E' Execute
            portal, _ = cstring(body, 0)
            self.pending.append(self.portals.get(portal, ''))
        elif t == 0x43:                                 # 'C' Close
            name, _ = cstring(body, 1)
            (self.statements if body[:1] == b'S' else self.portals).pop(name, None)
        elif t == 0x53:                                 # 'S' Sync
            texts, self.pending = self.pending, []
            self.push_call(texts)
        elif t == 0x46:                                 # 'F' FunctionCall
            self.push_call([''])

    def push_call(self, texts):
        self.proxy.calls += 1
        action = self.proxy.decide(texts)
        self.calls.append(Call(texts, action))

    async def client_pump(self):
        buf = bytearray()
        while True:
            data = await self.cr.read(65536)
            if not data:
                return
            buf += data
            pos = 0
            while len(buf) - pos >= 5:
                (n,) = struct.unpack_from('!I', buf, pos + 1)
                if len(buf) - pos < 1 + n:
                    break
                self.on_client_message(buf[pos], bytes(buf[pos + 5:pos + 1 + n]))
                pos += 1 + n
            if pos:
                # the calls are known before the server can answer them
                self.sw.write(bytes(buf[:pos]))
                del buf[:pos]
                await self.sw.drain()

    # -- server side ---------------------------------------------------------
    async def server_pump(self):
        buf = bytearray()
        out = bytearray()
        while True:
            data = await self.sr.read(65536)
            if not data:
                # the server closed: pass on everything it said, held or not
                for call in self.calls:
                    out += call.held
                    call.held.clear()
                if out:
                    self.cw.write(bytes(out))
                    await self.cw.drain()
                return
            buf += data
            pos = 0
            while len(buf) - pos >= 5:
                t = buf[pos]
                (n,) = struct.unpack_from('!I', buf, pos + 1)
                if len(buf) - pos < 1 + n:
                    break
                msg = buf[pos:pos + 1 + n]
                pos += 1 + n
                call = self.calls[0] if self.calls else None
                if call is None or call.action is None:
                    out += msg
                else:
                    call.held += msg
                    if t in (0x47, 0x57):               # 'G', 'W': the server waits for COPY data
                        out += call.held
                        call.held.clear()
                        call.action = None
                if t != 0x5A:                           # 'Z' ReadyForQuery
                    continue
                if self.calls:
                    self.calls.popleft()
                if call is None or call.action is None:
                    continue
                # a matched call's whole reply is in call.held
                if out:
                    self.cw.write(bytes(out))
                    out.clear()
                    await self.cw.drain()
                if call.action[0] == 'drop':
                    self.proxy.dropped += 1
                    self.close()
                    return
                self.proxy.delayed += 1
                await asyncio.sleep(call.action[1] / 1000.0)
                self.cw.write(bytes(call.held))
                await self.cw.drain()
            del buf[:pos]
            if out:
                self.cw.write(bytes(out))
                out.clear()
                await self.cw.drain()

    async def run(self):
        try:
            startup = await self.read_startup()
            if startup is None:
                return
            self.sr, self.sw = await self.proxy.open_upstream()
            if self.closed:                 # a reset came while connecting
                self.abort_upstream_only()
                return
            self.calls.append(Call(['<startup>'], None))
            self.sw.write(startup)
            await self.sw.drain()
            tasks = [asyncio.ensure_future(self.client_pump()),
                     asyncio.ensure_future(self.server_pump())]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            for t in tasks:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError):
            pass
        finally:
            self.close()

    def abort_upstream_only(self):
        linger0(self.sw)
        try:
            self.sw.transport.abort()
        except Exception:
            pass


class Proxy:
    def __init__(self, upstream_host, upstream_port):
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.rules = []
        self.conns = set()
        self.connections = self.dropped = self.delayed = self.calls = 0
        self.matched = self.resets = self.cancels = self.parses = 0

    async def open_upstream(self):
        if self.upstream_host.startswith('/'):
            path = os.path.join(self.upstream_host, '.s.PGSQL.%d' % self.upstream_port)
            return await asyncio.open_unix_connection(path)
        r, w = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        w.get_extra_info('socket').setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return r, w

    def decide(self, texts):
        for rule in list(self.rules):
            if not any(rule.substring in t for t in texts):
                continue
            if rule.kind == 'fraction':
                if rule.rng.random() >= rule.p:
                    continue
                action = ('drop',)
            elif rule.kind == 'drop':
                action = ('drop',)
            else:
                action = ('delay', rule.ms)
            rule.fired += 1
            if rule.count is not None and rule.fired >= rule.count:
                self.rules.remove(rule)
            self.matched += 1
            return action
        return None

    async def on_client(self, cr, cw):
        sock = cw.get_extra_info('socket')
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.connections += 1
        conn = Conn(self, cr, cw)
        self.conns.add(conn)
        try:
            await conn.run()
        finally:
            self.conns.discard(conn)

    # -- control -------------------------------------------------------------
    def command(self, line):
        try:
            words = shlex.split(line)
        except ValueError as e:
            return 'error %s' % e
        if not words:
            return 'error empty command'
        cmd, args = words[0], words[1:]
        try:
            if cmd == 'drop-reply' and len(args) == 2:
                count = int(args[1])
                if count < 1 or not args[0]:
                    raise ValueError('COUNT must be >= 1 and SUBSTRING not empty')
                self.rules.append(Rule('drop', args[0], count=count))
                return 'ok rule %d' % len(self.rules)
            if cmd == 'delay-reply' and len(args) == 3:
                ms, count = int(args[1]), int(args[2])
                if ms < 0 or count < 1 or not args[0]:
                    raise ValueError('MS must be >= 0, COUNT >= 1, SUBSTRING not empty')
                self.rules.append(Rule('delay', args[0], count=count, ms=ms))
                return 'ok rule %d' % len(self.rules)
            if cmd == 'drop-fraction' and len(args) == 3:
                p, seed = float(args[1]), int(args[2])
                if not 0.0 <= p <= 1.0 or not args[0]:
                    raise ValueError('P must be in [0, 1] and SUBSTRING not empty')
                self.rules.append(Rule('fraction', args[0], p=p, seed=seed))
                return 'ok rule %d' % len(self.rules)
            if cmd == 'reset' and not args:
                conns = [c for c in self.conns if not c.closed]
                for c in conns:
                    c.abort()
                self.resets += len(conns)
                return 'ok reset=%d' % len(conns)
            if cmd == 'clear' and not args:
                n = len(self.rules)
                self.rules.clear()
                return 'ok cleared=%d' % n
            if cmd == 'stats' and not args:
                return ('ok connections=%d dropped=%d delayed=%d calls=%d open=%d matched=%d '
                        'resets=%d cancels=%d parses=%d rules=%d' % (
                            self.connections, self.dropped, self.delayed, self.calls,
                            sum(1 for c in self.conns if not c.closed), self.matched,
                            self.resets, self.cancels, self.parses, len(self.rules)))
            if cmd == 'rules' and not args:
                return 'ok ' + ('; '.join(r.describe() for r in self.rules) or 'none')
            if cmd == 'ping' and not args:
                return 'ok'
        except ValueError as e:
            return 'error %s' % e
        return 'error unknown command or wrong arguments: %s' % line.strip()

    async def on_control(self, r, w):
        try:
            line = await asyncio.wait_for(r.readline(), 10)
            answer = self.command(line.decode('utf-8', 'replace'))
            w.write((answer.replace('\n', ' ') + '\n').encode())
            await w.drain()
        except Exception:
            pass
        finally:
            w.close()


async def serve(args):
    proxy = Proxy(args.upstream_host, args.upstream_port)
    server = await asyncio.start_server(proxy.on_client, '127.0.0.1', args.listen_port,
                                        reuse_address=True, backlog=256)
    try:
        os.unlink(args.control)
    except FileNotFoundError:
        pass
    control = await asyncio.start_unix_server(proxy.on_control, args.control)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write('ready %d\n' % port)
    sys.stdout.flush()
    await stop.wait()
    server.close()
    control.close()
    for c in list(proxy.conns):
        c.abort()
    try:
        os.unlink(args.control)
    except FileNotFoundError:
        pass


def ctl(sockpath, command, timeout=10.0):
    """Send one command; return the answer line (raises OSError)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sockpath)
        s.sendall(command.encode() + b'\n')
        data = b''
        while not data.endswith(b'\n'):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.decode('utf-8', 'replace').strip()
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('serve', help='run the proxy')
    s.add_argument('--listen-port', type=int, required=True)
    s.add_argument('--upstream-host', required=True)
    s.add_argument('--upstream-port', type=int, required=True)
    s.add_argument('--control', required=True)
    c = sub.add_parser('ctl', help='send one control command')
    c.add_argument('sockpath')
    c.add_argument('command')
    args = ap.parse_args()
    if args.cmd == 'serve':
        asyncio.run(serve(args))
        return 0
    try:
        answer = ctl(args.sockpath, args.command)
    except OSError as e:
        print('error cannot reach %s: %s' % (args.sockpath, e))
        return 2
    print(answer)
    return 0 if answer.startswith('ok') else 1


if __name__ == '__main__':
    sys.exit(main())
