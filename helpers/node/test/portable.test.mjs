// test/portable.test.mjs: the portable edition's plain script that the
// package carries (docs/helpers.md, "The portable edition's script"):
// portableSql(), installPortable(db) and the bin `pg-idempotency
// portable-sql`. The script is installed twice in a database of its own
// (created and dropped here: the role needs CREATEDB): edition() answers
// 'portable' at the release's version, and the second run changes no
// catalog row (the same oids too) and no record. Where the C edition answers
// in the tests' database, the script refuses it (55000) and nothing changes.
// PG* environment.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { installPortable, portableSql } from 'pg-idempotency';
import { installedEdition, prepareEdition } from './edition.mjs';

// the same text in the three helpers' tests (tests/test_portable.py)
const SNAPSHOT_SQL = `
SELECT md5(string_agg(t, E'\\n' ORDER BY t)) AS s FROM (
    SELECT p.oid::int || ' ' || p.oid::regprocedure::text || p.prosrc || coalesce(p.proacl::text, '')
           || coalesce(p.proconfig::text, '') || coalesce(obj_description(p.oid, 'pg_proc'), '') AS t
    FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
    UNION ALL SELECT c.oid::int || ' ' || c.oid::regclass::text || c.relkind::text || coalesce(c.relacl::text, '')
           || coalesce(obj_description(c.oid, 'pg_class'), '')
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL SELECT t.oid::int || ' ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL SELECT 'j ' || j::text FROM idempotency.job_types j
    UNION ALL SELECT 'o ' || o::text FROM idempotency.operations o) x`;

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
const RELEASE = pkg.version.split('.').slice(0, 2).join('.');   // the package 0.5.0 carries the script of 0.5
const BIN = fileURLToPath(new URL(`../${pkg.bin['pg-idempotency']}`, import.meta.url));
const SCRATCH = `node_unit_portable_${process.pid}`;
let admin;
let scratchMade = false;

before(async () => {
  admin = new pg.Client();
  await admin.connect();
  await admin.query('SET client_min_messages = warning');
  await prepareEdition(admin);
});

after(async () => {
  if (scratchMade) await admin.query(`DROP DATABASE IF EXISTS ${SCRATCH} WITH (FORCE)`);
  await admin?.end();
});

// a new database of the test, owned by the tests' role; null without CREATEDB
async function scratch() {
  await admin.query(`DROP DATABASE IF EXISTS ${SCRATCH} WITH (FORCE)`);
  try {
    await admin.query(`CREATE DATABASE ${SCRATCH}`);
  } catch (err) {
    if (err.code === '42501') return null;
    throw err;
  }
  scratchMade = true;
  return SCRATCH;
}

test('the script is plain SQL of this release', () => {
  const sql = portableSql();
  assert.ok(sql.startsWith(`/*\n * idempotency ${RELEASE}, portable edition, as a plain script`));
  const lines = sql.split('\n');
  assert.ok(lines.includes('BEGIN;'));
  assert.equal(lines.at(-1), '');
  assert.equal(lines.at(-2), 'COMMIT;');
  assert.deepEqual(lines.filter((l) => l.startsWith('\\')), [], 'a psql meta-command');
});

test('the bin pg-idempotency portable-sql prints the script', () => {
  assert.equal(execFileSync(process.execPath, [BIN, 'portable-sql'], { encoding: 'utf8', maxBuffer: 1 << 24 }),
               portableSql());
  const bad = spawnSync(process.execPath, [BIN, 'nonsense'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.equal(bad.stdout, '');
  assert.match(bad.stderr, /portable-sql/);
});

test('installPortable twice changes nothing', async (t) => {
  const db = await scratch();
  if (db === null) return t.skip("the tests' role may not create a database (CREATEDB)");
  const client = new pg.Client({ database: db });
  // the next test drops this database WITH (FORCE): a connection whose
  // close has not reached the server by then gets 57P01 as an 'error'
  // event, after this test ended (seen once in the Debian 13 root)
  client.on('error', () => {});
  await client.connect();
  const pool = new pg.Pool({ database: db, max: 1, options: '-c client_min_messages=warning' });
  pool.on('error', () => {});
  try {
    await client.query('SET client_min_messages = warning');
    assert.deepEqual(await installPortable(client), { edition: 'portable', version: RELEASE });
    assert.equal(client.getTransactionStatus(), 'I');
    // a job type and a claim in flight, kept by the second run
    await client.query("INSERT INTO idempotency.job_types (job_type, lease, stale_policy) " +
                       "VALUES ('portable_t', interval '1 minute', 'retry')");
    await client.query("SELECT idempotency.claim_operation('portable_t', 'K1', 'fp', 'w', delivery => 'd1')");
    const before = (await client.query(SNAPSHOT_SQL)).rows[0].s;
    // on a pg.Pool this time
    assert.deepEqual(await installPortable(pool), { edition: 'portable', version: RELEASE });
    assert.equal((await client.query(SNAPSHOT_SQL)).rows[0].s, before);
    assert.deepEqual((await client.query("SELECT status::text, attempt FROM idempotency.operations " +
                                         "WHERE job_type = 'portable_t'")).rows, [{ status: 'claimed', attempt: 1 }]);
    // in a transaction of the caller's: refused, nothing run
    await client.query('BEGIN');
    await assert.rejects(installPortable(client), /in a transaction/);
    await client.query('ROLLBACK');
  } finally {
    await pool.end();
    await client.end();
  }
});

test('the printed script installs with psql', async (t) => {
  const db = await scratch();
  if (db === null) return t.skip("the tests' role may not create a database (CREATEDB)");
  const printed = execFileSync(process.execPath, [BIN, 'portable-sql'], { maxBuffer: 1 << 24 });
  const psql = spawnSync('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', db,
                                  '-c', 'SET client_min_messages = warning', '-f', '-'],
                         { input: printed, encoding: 'utf8' });
  assert.equal(psql.status, 0, psql.stderr);
  const client = new pg.Client({ database: db });
  await client.connect();
  try {
    assert.deepEqual(await installedEdition(client), ['portable', RELEASE]);
  } finally {
    await client.end();
  }
});

test('refused where the C edition answers', async (t) => {
  if ((await installedEdition(admin))[0] !== 'c') return t.skip("the C edition does not answer in the tests' database");
  const client = new pg.Client();
  await client.connect();
  try {
    await assert.rejects(installPortable(client), (err) => err.code === '55000' && /extension/.test(err.message));
    assert.deepEqual((await client.query('SELECT edition FROM idempotency.edition()')).rows, [{ edition: 'c' }]);
  } finally {
    await client.end();
  }
});
