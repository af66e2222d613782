#!/usr/bin/env node
// test/matrix/browser-test.mjs: open the replay matrix's HTML report in
// Debian's headless Chromium and check it as a person would use it.
//
//   node test/matrix/browser-test.mjs REPORT.html [REPORT.json] [--out DIR]
//
// No npm packages: it speaks the Chrome DevTools Protocol over
// --remote-debugging-pipe (fd 3: commands to Chromium, fd 4: its answers,
// NUL-separated JSON), so nothing is downloaded, ever. CHROMIUM overrides
// the browser (default /usr/bin/chromium).
//
// Checks: the page renders (title, settings, one table per policy, the total
// agrees with the JSON); it loads nothing from the network and throws no
// error; in a narrow window each matrix overflows and is a focusable region
// (role, tabindex=0, aria-label) reachable with Tab; ArrowRight scrolls it
// right (scrollLeft increases), ArrowLeft back, End/Home to the edges; the
// focus is visible; in print media nothing is clipped and a PDF comes out.
// It saves a screenshot and the PDF in --out (default: beside the report).
// Prints "ok"/"not ok" per check, then "N passed, N failed"; exits 1 on any
// failure.

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const args = process.argv.slice(2);
let outDir = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--out') outDir = args[++i];
  else files.push(args[i]);
}
if (files.length < 1 || files.length > 2) {
  console.error('usage: browser-test.mjs REPORT.html [REPORT.json] [--out DIR]');
  process.exit(2);
}
const htmlPath = resolve(files[0]);
const report = files[1] ? JSON.parse(readFileSync(files[1], 'utf8')) : null;
outDir = resolve(outDir || dirname(htmlPath));
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const WIDTH = 640;
const HEIGHT = 900;

let passed = 0;
let failed = 0;
function check(ok, what, detail) {
  if (ok) {
    passed++;
    console.log(`ok ${passed + failed} - ${what}`);
  } else {
    failed++;
    console.log(`not ok ${passed + failed} - ${what}${detail !== undefined ? `: ${detail}` : ''}`);
  }
  return ok;
}

// ---------------------------------------------------------------- the browser
const profile = mkdtempSync(join(tmpdir(), 'matrix-chromium-'));
const browser = spawn(chromium, [
  '--headless', '--no-sandbox', '--disable-gpu',
  '--disable-background-networking', '--disable-component-update',
  '--disable-sync', '--no-first-run', '--no-default-browser-check',
  '--disable-extensions', '--mute-audio', '--hide-scrollbars=false',
  `--user-data-dir=${profile}`, '--remote-debugging-pipe',
  `--window-size=${WIDTH},${HEIGHT}`, 'about:blank',
], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });

let stderrTail = '';
browser.stderr.on('data', (d) => { stderrTail = (stderrTail + d).slice(-4000); });

const toBrowser = browser.stdio[3];
const fromBrowser = browser.stdio[4];
let nextId = 1;
const pending = new Map();
const listeners = [];
let inbuf = Buffer.alloc(0);

fromBrowser.on('data', (chunk) => {
  inbuf = Buffer.concat([inbuf, chunk]);
  let nul;
  while ((nul = inbuf.indexOf(0)) >= 0) {
    const msg = JSON.parse(inbuf.subarray(0, nul).toString('utf8'));
    inbuf = inbuf.subarray(nul + 1);
    if (msg.id && pending.has(msg.id)) {
      const { ok, fail } = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) fail(new Error(`${msg.error.message} (${msg.error.code})`));
      else ok(msg.result);
    } else if (msg.method) {
      for (const l of listeners) l(msg);
    }
  }
});

function send(method, params = {}, sessionId) {
  const id = nextId++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  return new Promise((ok, fail) => {
    pending.set(id, { ok, fail });
    toBrowser.write(JSON.stringify(msg) + '\0');
  });
}

function waitFor(method, sessionId, ms = 15000) {
  return new Promise((ok, fail) => {
    const t = setTimeout(() => fail(new Error(`timed out waiting for ${method}`)), ms);
    listeners.push(function l(msg) {
      if (msg.method === method && (!sessionId || msg.sessionId === sessionId)) {
        clearTimeout(t);
        listeners.splice(listeners.indexOf(l), 1);
        ok(msg.params);
      }
    });
  });
}

const watchdog = setTimeout(() => {
  console.log('not ok - the browser test took longer than 90 s');
  finish(1);
}, 90000);

let finished = false;
function finish(code) {
  if (finished) return;
  finished = true;
  clearTimeout(watchdog);
  try { browser.kill('SIGKILL'); } catch { /* gone */ }
  try { rmSync(profile, { recursive: true, force: true }); } catch { /* left */ }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(code);
}

browser.on('exit', (code, sig) => {
  if (!finished) {
    console.log(`not ok - chromium exited (${code ?? sig}) early; its stderr:\n${stderrTail}`);
    failed++;
    finish(1);
  }
});
browser.on('error', (e) => {
  console.log(`not ok - cannot start ${chromium}: ${e.message} (apt-get install -y chromium)`);
  failed++;
  finish(1);
});

// ------------------------------------------------------------------- the test
async function main() {
  const { targetInfos } = await send('Target.getTargets');
  let page = targetInfos.find((t) => t.type === 'page');
  const targetId = page ? page.targetId : (await send('Target.createTarget', { url: 'about:blank' })).targetId;
  const { sessionId: s } = await send('Target.attachToTarget', { targetId, flatten: true });
  const cmd = (m, p) => send(m, p, s);

  const requests = [];
  const errors = [];
  listeners.push((msg) => {
    if (msg.sessionId !== s) return;
    if (msg.method === 'Network.requestWillBeSent') requests.push(msg.params.request.url);
    if (msg.method === 'Runtime.exceptionThrown') errors.push(msg.params.exceptionDetails.text);
    if (msg.method === 'Runtime.consoleAPICalled' && msg.params.type === 'error') {
      errors.push(msg.params.args.map((a) => a.value).join(' '));
    }
    if (msg.method === 'Log.entryAdded' && msg.params.entry.level === 'error') {
      errors.push(msg.params.entry.text);
    }
  });
  await cmd('Page.enable');
  await cmd('Runtime.enable');
  await cmd('Network.enable');
  await cmd('Log.enable');
  await cmd('Emulation.setDeviceMetricsOverride', { width: WIDTH, height: HEIGHT, deviceScaleFactor: 1, mobile: false });
  await cmd('Emulation.setFocusEmulationEnabled', { enabled: true });
  await cmd('Page.bringToFront');

  const loaded = waitFor('Page.loadEventFired', s);
  await cmd('Page.navigate', { url: pathToFileURL(htmlPath).href });
  await loaded;

  const js = async (expr) => {
    const r = await cmd('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expr}: ${r.exceptionDetails.text}`);
    return r.result.value;
  };
  const frame = () => js('new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))');
  const key = async (name, code, vk) => {
    await cmd('Input.dispatchKeyEvent', { type: 'rawKeyDown', key: name, code, windowsVirtualKeyCode: vk, nativeVirtualKeyCode: vk });
    await cmd('Input.dispatchKeyEvent', { type: 'keyUp', key: name, code, windowsVirtualKeyCode: vk, nativeVirtualKeyCode: vk });
    await frame();
  };

  // -- it renders
  const info = await js(`({
    title: document.title,
    h1: (document.querySelector('h1') || {}).textContent || '',
    total: (document.getElementById('total') || {}).textContent || '',
    date: (document.getElementById('setting-date') || {}).textContent || '',
    ext: (document.getElementById('setting-extension_version') || {}).textContent || '',
    pg: (document.getElementById('setting-server_version') || {}).textContent || '',
    lease: (document.getElementById('setting-lease') || {}).textContent || '',
    tables: document.querySelectorAll('.matrix table').length,
    rows: Array.from(document.querySelectorAll('.matrix table')).map(t => t.tBodies[0].rows.length),
    bodyHeight: document.body.scrollHeight,
    external: Array.from(document.querySelectorAll('[src],link[href],[href^="http"]')).map(e => e.getAttribute('src') || e.getAttribute('href')),
  })`);
  check(/Replay matrix/.test(info.title) && /Replay matrix/.test(info.h1), 'the page renders with its title and heading', info.title);
  check(info.bodyHeight > HEIGHT, 'the page has content (taller than the window)', info.bodyHeight);
  check(/^\d+ passed, \d+ failed$/.test(info.total.trim()), 'the total line reads "N passed, N failed"', info.total);
  check(/\d{4}-\d\d-\d\d/.test(info.date), 'the settings show the date', info.date);
  check(/idempotency \S+/.test(info.ext), 'the settings show the extension version', info.ext);
  check(/PostgreSQL \d+/.test(info.pg), 'the settings show the PostgreSQL version', info.pg);
  check(/second/.test(info.lease), 'the settings show the lease', info.lease);
  if (report) {
    check(info.total.trim() === `${report.passed} passed, ${report.failed} failed`, 'the total agrees with the JSON report', `${info.total} vs ${report.passed}/${report.failed}`);
    check(info.tables === report.policies.length, 'one matrix per policy in the JSON report', `${info.tables} vs ${report.policies.length}`);
    check(JSON.stringify(info.rows) === JSON.stringify(report.policies.map((p) => p.cases.length)), 'every case of the JSON report has a row', JSON.stringify(info.rows));
    check(info.ext.includes(report.settings.extension_version), 'the extension version agrees with the JSON report', info.ext);
  } else {
    check(info.tables >= 1, 'at least one matrix table', info.tables);
  }
  check(info.external.length === 0, 'no external resources referenced', info.external.join(' '));
  check(requests.every((u) => /^(file|data|about):/.test(u)), 'nothing loaded from the network', requests.filter((u) => !/^(file|data|about):/.test(u)).join(' '));
  check(errors.length === 0, 'no script errors or console errors', errors.join(' | '));

  // -- the matrix regions
  const regions = await js(`Array.from(document.querySelectorAll('.matrix')).map(el => ({
    role: el.getAttribute('role'), tabindex: el.getAttribute('tabindex'),
    label: el.getAttribute('aria-label') || '', overflowX: getComputedStyle(el).overflowX,
    scrollWidth: el.scrollWidth, clientWidth: el.clientWidth }))`);
  check(regions.length > 0 && regions.every((r) => r.role === 'region' && r.tabindex === '0' && r.label.length > 0),
    'each matrix is a focusable region with role="region", tabindex="0" and an aria-label', JSON.stringify(regions[0]));
  check(regions.every((r) => r.overflowX === 'auto' || r.overflowX === 'scroll'), 'each matrix scrolls horizontally (overflow-x)', regions.map((r) => r.overflowX).join());
  check(regions.every((r) => r.scrollWidth > r.clientWidth), `in a ${WIDTH}px window every matrix is wider than its box`, regions.map((r) => `${r.scrollWidth}>${r.clientWidth}`).join(' '));

  // -- keyboard: Tab reaches the first matrix, the arrows scroll it
  let tabs = 0;
  let focused = '';
  while (tabs < 30) {
    await key('Tab', 'Tab', 9);
    tabs++;
    focused = await js(`document.activeElement && document.activeElement.classList.contains('matrix') ? document.activeElement.getAttribute('aria-label') : ''`);
    if (focused) break;
  }
  check(focused !== '', `Tab reaches the first matrix (${tabs} presses)`, focused);
  const outline = await js(`(() => { const cs = getComputedStyle(document.activeElement); return cs.outlineStyle + ' ' + cs.outlineWidth; })()`);
  check(!/^none/.test(outline) && !/ 0px$/.test(outline), 'the focused matrix shows a visible focus outline', outline);
  await js(`(document.querySelector('.matrix').scrollIntoView({block: 'start'}), true)`);
  await frame();
  const shot1 = await cmd('Page.captureScreenshot', { format: 'png' });
  const sl = () => js('document.activeElement.scrollLeft');
  const x0 = await sl();
  await key('ArrowRight', 'ArrowRight', 39);
  const x1 = await sl();
  check(x0 === 0 && x1 > x0, 'ArrowRight on the focused matrix scrolls it right (scrollLeft increases)', `${x0} -> ${x1}`);
  await key('ArrowRight', 'ArrowRight', 39);
  const x2 = await sl();
  check(x2 > x1, 'a second ArrowRight scrolls further', `${x1} -> ${x2}`);
  await key('ArrowLeft', 'ArrowLeft', 37);
  const x3 = await sl();
  check(x3 < x2, 'ArrowLeft scrolls back left', `${x2} -> ${x3}`);
  await key('End', 'End', 35);
  const x4 = await sl();
  const max = await js('document.activeElement.scrollWidth - document.activeElement.clientWidth');
  check(Math.abs(x4 - max) <= 1, 'End scrolls to the right edge', `${x4} of ${max}`);
  const shot2 = await cmd('Page.captureScreenshot', { format: 'png' });
  await key('Home', 'Home', 36);
  check((await sl()) === 0, 'Home scrolls back to the left edge');
  const stillFocused = await js(`document.activeElement.classList.contains('matrix')`);
  check(stillFocused, 'the matrix keeps the focus while scrolling');

  // -- print
  await cmd('Emulation.setEmulatedMedia', { media: 'print' });
  await frame();
  const print = await js(`(() => { const el = document.querySelector('.matrix'); const t = el.querySelector('table');
    return { overflowX: getComputedStyle(el).overflowX, ws: getComputedStyle(t).whiteSpace,
      hint: getComputedStyle(document.querySelector('.hint')).display }; })()`);
  check(print.overflowX === 'visible' && print.ws === 'normal', 'print media: the matrix is not clipped (overflow visible, cells wrap)', JSON.stringify(print));
  check(print.hint === 'none', 'print media: the on-screen scrolling hint is hidden', print.hint);
  await cmd('Emulation.setEmulatedMedia', { media: '' });
  const pdf = await cmd('Page.printToPDF', { landscape: true, printBackground: false, preferCSSPageSize: true });
  const pdfBytes = Buffer.from(pdf.data, 'base64');
  check(pdfBytes.subarray(0, 5).toString() === '%PDF-' && pdfBytes.length > 10000, 'it prints to a PDF', `${pdfBytes.length} bytes`);

  const stem = basename(htmlPath).replace(/\.html?$/, '');
  writeFileSync(join(outDir, `${stem}-narrow.png`), Buffer.from(shot1.data, 'base64'));
  writeFileSync(join(outDir, `${stem}-scrolled.png`), Buffer.from(shot2.data, 'base64'));
  writeFileSync(join(outDir, `${stem}.pdf`), pdfBytes);
  console.log(`# screenshots and PDF in ${outDir}`);
}

main().then(() => finish(failed ? 1 : 0), (e) => {
  failed++;
  console.log(`not ok - ${e.message}`);
  finish(1);
});
