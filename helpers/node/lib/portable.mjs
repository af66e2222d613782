// lib/portable.mjs: the portable edition's plain script (docs/portable.md),
// as this release of the package carries it: made from the repository's
// portable/*.sql when the package was packed (package.json's prepare,
// helpers/portable-sql.sh), so the script and the helpers are of one
// release. For an app's migrations, as libraries built on pgmq embed pgmq's
// schema:
//
//   import { portableSql, installPortable } from 'pg-idempotency';
//   portableSql()                  // the script, as a string
//   await installPortable(pool)    // or run it on a pg.Pool / pg.Client
//
//   npx pg-idempotency portable-sql > idempotency-portable.sql
import { readFileSync } from 'node:fs';
import pg from 'pg';

export const PORTABLE_SQL_FILE = new URL('../idempotency-portable.sql', import.meta.url);

// The portable edition's plain script of this release: plain SQL with no
// psql meta-command, one transaction of its own (BEGIN ... COMMIT), run by
// the database's owner (no superuser). A fresh install, or the in-place
// upgrade of an older portable install; run again, it changes nothing; it
// refuses (55000) a database where the C extension is, and a newer
// portable install.
export function portableSql() {
  try {
    return readFileSync(PORTABLE_SQL_FILE, 'utf8');
  } catch (err) {
    if (err.code !== 'ENOENT') throw err;
    throw new Error('pg-idempotency: idempotency-portable.sql is not in this copy of the package; it is made ' +
                    'when the package is packed (npm pack, npm publish: its prepare script; in a checkout, ' +
                    'helpers/portable-sql.sh helpers/node/idempotency-portable.sql)');
  }
}

// Runs portableSql() on db (a pg.Pool: on one of its clients; a pg.Client
// or a pool's client, as the database's owner) and resolves to what
// idempotency.edition() then answers, { edition: 'portable', version }. The
// script is one transaction of its own, so a client must not be in a
// transaction (rejected otherwise, where the client reports its status:
// getTransactionStatus(), as pg 8.23 does). An error (e.g. 55000: the C
// extension is installed in that database) rejects after the script's
// transaction was rolled back: nothing changed.
export async function installPortable(db) {
  if (db instanceof pg.Pool) {
    const client = await db.connect();
    try {
      return await installPortable(client);
    } finally {
      client.release();
    }
  }
  const status = () => (typeof db.getTransactionStatus === 'function' ? db.getTransactionStatus() : null);
  if (status() !== null && status() !== 'I') {
    throw new Error('installPortable: the connection is in a transaction (the script runs its own: ' +
                    'BEGIN ... COMMIT); commit or roll back first');
  }
  try {
    await db.query(portableSql());   // no parameters: one simple query, every statement of the script
  } catch (err) {
    // the script's first statement is its BEGIN: after an error the session
    // is in its aborted transaction (pg reports the status of that moment
    // only at the next query)
    await db.query('ROLLBACK').catch(() => {});
    throw err;
  }
  const { rows } = await db.query('SELECT edition, version FROM idempotency.edition()');
  return { edition: rows[0].edition, version: rows[0].version };
}
