// test/conformance.test.mjs: the shared sign-off conformance cases
// (helpers/conformance/signoff.json, docs/helpers.md), run against this
// package: every case of the file, one test each, named after it. The Python
// and Ruby helpers run the same file with their own test runners. No
// database.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parseJobTypes, parseLease, signoff, signoffAnswer, signoffHelloMessage, signoffMessage, SignoffError,
         SIGNOFF_VERSION } from 'pg-idempotency';

const CASES = JSON.parse(readFileSync(new URL('../../conformance/signoff.json', import.meta.url), 'utf8'));

// the error thrown by fn, which must be a `cls`
function thrown(fn, cls) {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof cls, `${err?.constructor?.name}: ${err?.message}`);
    return err;
  }
  assert.fail('nothing thrown');
}

test('the protocol version', () => {
  assert.equal(SIGNOFF_VERSION, CASES.protocol_version);
});

for (const c of CASES.job_types) {
  test(`job_types: ${c.name}`, () => {
    const text = c.env.IDEMPOTENCY_SIGNOFF_JOB_TYPES;
    const so = signoff(c.env);   // the case's environment, as a process reads it
    if ('refusal' in c) {
      assert.equal(thrown(() => parseJobTypes(text), SignoffError).message, c.refusal);
      assert.equal(thrown(() => so.jobType('a'), SignoffError).message, c.refusal);   // every call
      return;
    }
    assert.deepEqual(Object.fromEntries(parseJobTypes(text)), c.map);
    for (const [yours, used] of Object.entries(c.lookups)) assert.equal(so.jobType(yours), used, yours);
  });
}

for (const c of CASES.lease) {
  test(`lease: ${c.name}`, () => {
    const text = c.env.IDEMPOTENCY_SIGNOFF_LEASE;
    const so = signoff(c.env);
    if ('refusal' in c) {
      assert.equal(thrown(() => parseLease(text), SignoffError).message, c.refusal);
      assert.equal(thrown(() => so.lease(), SignoffError).message, c.refusal);
      return;
    }
    assert.equal(parseLease(text), c.lease);
    assert.equal(so.lease(), c.lease);
  });
}

for (const c of CASES.hello_armed) {
  test(`hello_armed: ${c.name}`, () => {
    assert.equal(signoff(c.env).helloArmed, c.hello);
  });
}

for (const c of CASES.hellos) {
  test(`hellos: ${c.name}`, () => {
    const { pid, ...fields } = c.input;
    const line = signoffHelloMessage(fields, pid);
    assert.ok(line.endsWith('\n') && line.split('\n').length === 2, line);
    assert.deepEqual(JSON.parse(line), c.line);
    assert.deepEqual(Object.keys(JSON.parse(line)), Object.keys(c.line));   // the fields in the documented order
  });
}

for (const c of CASES.messages) {
  test(`messages: ${c.name}`, () => {
    const { point, pid, ...fields } = c.input;
    if ('error' in c) {
      assert.equal(thrown(() => signoffMessage(point, fields, pid), Error).message, c.error);
      return;
    }
    const line = signoffMessage(point, fields, pid);
    assert.ok(line.endsWith('\n') && line.indexOf('\n') === line.length - 1, line);
    assert.deepEqual(JSON.parse(line), c.line);
  });
}

for (const c of CASES.answers) {
  test(`answers: ${c.name}`, () => {
    if ('error' in c) {
      assert.equal(thrown(() => signoffAnswer(c.point, c.received), SignoffError).message, c.error);
      const where = 'sign-off runner at /r.sock, point P of t/k';
      assert.equal(thrown(() => signoffAnswer(c.point, c.received, where), SignoffError).message,
                   `${where}: ${c.error}`);
      return;
    }
    assert.equal(signoffAnswer(c.point, c.received), c.answer);
  });
}
