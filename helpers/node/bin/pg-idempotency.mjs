#!/usr/bin/env node
// pg-idempotency portable-sql: prints the portable edition's plain script of
// this release (portableSql()), e.g. for an app's migrations or psql -f:
//
//   npx pg-idempotency portable-sql > idempotency-portable.sql
import { portableSql } from '../lib/portable.mjs';

const USAGE = 'usage: pg-idempotency portable-sql\n' +
              "  portable-sql  print the portable edition's plain script (docs/portable.md)\n";
const args = process.argv.slice(2);
if (args.length === 1 && (args[0] === '-h' || args[0] === '--help')) {
  process.stdout.write(USAGE);
} else if (args.length === 1 && args[0] === 'portable-sql') {
  process.stdout.write(portableSql());
} else {
  process.stderr.write(USAGE);
  process.exitCode = 2;
}
