// test/edition.mjs: the edition the tests run on, for every test file's
// `before`. IDEMPOTENCY_EDITION=portable: the database must hold the
// portable edition; where no edition answers, it is installed with this
// package's installPortable (as the database's owner: PGUSER), where the C
// edition answers the tests stop. IDEMPOTENCY_EDITION=c: the C extension
// (created if missing). Unset: whichever answers, else the C extension is
// created.
//
// The tests import this checkout's sources (the package's own name,
// resolved to this directory): the portable script is made here first, as
// the package's prepare script makes it (npm pack), when the repository's
// helpers/portable-sql.sh is there.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { PORTABLE_SQL_FILE } from '../lib/portable.mjs';
import { installPortable } from 'pg-idempotency';

const make = fileURLToPath(new URL('../../portable-sql.sh', import.meta.url));
if (existsSync(make)) execFileSync('sh', [make, fileURLToPath(PORTABLE_SQL_FILE)], { stdio: 'inherit' });

export const EDITION = process.env.IDEMPOTENCY_EDITION || null;

// [edition, version] of the idempotency that answers in client's database, or null
export async function installedEdition(client) {
  const { rows: [{ has }] } = await client.query(
    "SELECT pg_catalog.to_regprocedure('idempotency.edition()') IS NOT NULL AS has");
  if (has) {
    const { rows: [r] } = await client.query('SELECT edition, version FROM idempotency.edition()');
    return [r.edition, r.version];
  }
  const { rows } = await client.query("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'");
  return rows.length ? ['c', rows[0].extversion] : null;
}

// the edition the tests want, in admin's database (a connected pg.Client)
export async function prepareEdition(admin) {
  if (![null, 'c', 'portable'].includes(EDITION)) {
    throw new Error(`IDEMPOTENCY_EDITION must be c or portable, not '${EDITION}'`);
  }
  let installed = await installedEdition(admin);
  if (installed === null) {
    if (EDITION === 'portable') await installPortable(admin);
    else await admin.query('CREATE EXTENSION IF NOT EXISTS idempotency');
    installed = await installedEdition(admin);
  }
  if (EDITION !== null && installed[0] !== EDITION) {
    throw new Error(`IDEMPOTENCY_EDITION=${EDITION}, but the ${installed[0]} edition (${installed[1]}) answers ` +
                    `in database ${admin.database}`);
  }
  return installed;
}
