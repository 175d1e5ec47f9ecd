// Tests of plugin.js for what `router plugins check` does not check
// (docs/plugin-protocol.md, section 9, "Not checked"): deadlines, the
// 64 MiB message limits, and what the process leaves behind when it stops.
// Run: node --test examples/node-plugin/ (cmd/router's
// TestNodeExampleUnitTests runs it too).
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
// protobufjs's own 64-bit integer type (a dependency of @grpc/proto-loader).
const Long = require('long');

const plugin = require('./plugin.js');

const SCRIPT = path.join(__dirname, 'plugin.js');

function configureOK(instance, type, params = {}) {
  const res = plugin.configure({ instance, type, role: 'aggregated', block_size: 512, params });
  assert.deepEqual(res.diagnostics, [], JSON.stringify(res.diagnostics));
  return res;
}

function task(id, stages, active, extra = {}) {
  return {
    task_id: id,
    request: { id: 'r' },
    candidates: { ids: active.map((_, i) => String(18446744073709551615n - BigInt(active.length - i))), active_requests: active.map(String), load_waiting: [] },
    stages,
    deadline_unix_nano: '0',
    ...extra,
  };
}

test('a task whose deadline passed is answered with an error, not run', () => {
  configureOK('aggregated/p/s', 'node-least-active');
  const now = Date.now() * 1e6;
  const late = plugin.decideTask(task('18446744073709551615', [{ instance: 'aggregated/p/s', weight: 1 }], [3, 1],
    { deadline_unix_nano: String(BigInt(now) - 1000n) }), now);
  assert.deepEqual(late, { task_id: '18446744073709551615', error: 'deadline passed before the task ran', picked: -1 });
  const onTime = plugin.decideTask(task('7', [{ instance: 'aggregated/p/s', weight: 2 }], [3, 1],
    { deadline_unix_nano: String(BigInt(now) + 20000000n) }), now);
  assert.deepEqual(onTime, { task_id: '7', picked: -1, costs: [6, 2] });
});

test('filters keep rows in sent order; a filter leaving none names itself', () => {
  configureOK('aggregated/p/cap', 'node-max-active', { max_active_requests: { int: '4', kind: 'int' } });
  configureOK('aggregated/p/s', 'node-least-active', { active_weight: { int: '2', kind: 'int' } });
  const stages = [{ instance: 'aggregated/p/cap', weight: 0 }, { instance: 'aggregated/p/s', weight: 0.5 }];
  assert.deepEqual(plugin.decideTask(task('1', stages, [5, 3, 4, 0]), 0), { task_id: '1', picked: -1, kept: [1, 3], costs: [3, 0] });
  assert.deepEqual(plugin.decideTask(task('2', stages, [9, 4]), 0), { task_id: '2', filtered_by: 'aggregated/p/cap', picked: -1 });
  assert.deepEqual(plugin.decideTask(task('3', [{ instance: 'nope', weight: 1 }], [1]), 0),
    { task_id: '3', error: 'unknown instance "nope"', picked: -1 });
});

test('a cost that overflows once weighted is an error naming the scorer', () => {
  configureOK('aggregated/p/big', 'node-least-active', { active_weight: { number: 1e6, kind: 'number' } });
  const r = plugin.decideTask(task('4', [{ instance: 'aggregated/p/big', weight: 1.7e308 }], [2]), 0);
  assert.equal(r.error, 'scorer "aggregated/p/big": the cost of row 0 is not finite (weight 1.7e+308)');
});

test('results are split into messages within the limit; one too large alone becomes the size error', () => {
  const written = [];
  const call = { write: (m) => written.push(m) };
  const big = (id, n) => ({ task_id: id, picked: -1, costs: new Array(n).fill(1.5) });
  // 1,000 bytes: 100 costs (~800 bytes) fit one to a message; 200 do not fit at all.
  plugin.sendResults(call, [big('1', 100), big('2', 100), big('3', 200), { task_id: '4', picked: -1 }], 1000);
  const sizes = written.map((m) => plugin.decideSerialize(m).length);
  for (const n of sizes) assert.ok(n <= 1000, `message of ${n} bytes`);
  const results = written.flatMap((m) => m.results);
  assert.deepEqual(results.map((r) => r.task_id), ['1', '2', '3', '4']);
  assert.match(results[2].error, /^result of \d+ bytes exceeds the 1000-byte limit$/);
  assert.equal(results[2].costs, undefined);
});

// start runs plugin.js as the router would (docs/plugin-protocol.md,
// section 1): its own environment only, a fresh socket directory, and
// returns the child, the directory and the handshake's address.
async function start() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sy-nodetest-'));
  const child = spawn(process.execPath, [SCRIPT], {
    env: { SWITCHYARD_PLUGIN: plugin.COOKIE_VALUE, PLUGIN_UNIX_SOCKET_DIR: dir, PLUGIN_PROTOCOL_VERSIONS: '1', PLUGIN_MIN_PORT: '10000', PLUGIN_MAX_PORT: '25000' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (b) => { stderr += b; });
  const line = await new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (b) => {
      out += b;
      const i = out.indexOf('\n');
      if (i >= 0) resolve(out.slice(0, i));
    });
    child.on('exit', (code) => reject(new Error(`plugin exited ${code} before its handshake: ${stderr}`)));
  });
  const [core, app, network, addr, protocol] = line.split('|');
  assert.deepEqual([core, app, network, protocol], ['1', '1', 'unix', 'grpc']);
  assert.equal(path.dirname(addr), dir);
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return { child, dir, addr, exited, stderr: () => stderr };
}

function clients(addr) {
  const def = protoLoader.loadSync([
    path.join(__dirname, '../../shared/pluginproto/switchyard/plugin/v1/plugin.proto'),
    path.join(__dirname, '../../sdk/python/proto/grpc_controller.proto'),
    path.join(__dirname, '../../sdk/python/proto/health.proto'),
  ], { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
  const p = grpc.loadPackageDefinition(def);
  const opts = { 'grpc.max_receive_message_length': plugin.MAX_MESSAGE_BYTES, 'grpc.max_send_message_length': plugin.MAX_MESSAGE_BYTES };
  const creds = grpc.credentials.createInsecure();
  return {
    plugin: new p.switchyard.plugin.v1.Plugin(`unix:${addr}`, creds, opts),
    controller: new p.plugin.GRPCController(`unix:${addr}`, creds, opts),
    health: new p.grpc.health.v1.Health(`unix:${addr}`, creds, opts),
  };
}

test('a 5.6 MB DecideBatch is read and its 4.5 MB answer sent (over gRPC\'s 4 MiB defaults); Shutdown exits 0 leaving the directory', async () => {
  const p = await start();
  const c = clients(p.addr);
  try {
    const conf = await new Promise((resolve, reject) => c.plugin.Configure(
      { instance: 'aggregated/p/s', type: 'node-least-active', role: 'aggregated', block_size: 512, params: {} },
      (err, res) => (err ? reject(err) : resolve(res))));
    assert.deepEqual(conf.diagnostics, []);
    // 560,000 rows: 5.6 MB of ids in, 4.5 MB of costs out.
    const rows = 560000;
    const active = Array.from({ length: rows }, (_, i) => i % 7);
    // Ids above 2^63 (10 bytes each on the wire), built as Longs directly:
    // protobufjs encodes a string id through Long.fromString, slowly.
    const ids = Array.from({ length: rows }, (_, i) => new Long(i, 0x80000000, true));
    const stream = c.plugin.Decide();
    const got = new Promise((resolve, reject) => {
      stream.on('data', resolve);
      stream.on('error', reject);
    });
    const now = BigInt(Date.now()) * 1000000n;
    stream.write({ tasks: [
      { task_id: '9223372036854775809', candidates: { ids, active_requests: active }, stages: [{ instance: 'aggregated/p/s', weight: 1 }], deadline_unix_nano: String(now + 60000000000n) },
      { task_id: '2', candidates: { ids: ['1'], active_requests: ['1'] }, stages: [{ instance: 'aggregated/p/s', weight: 1 }], deadline_unix_nano: String(now - 1n) },
    ] });
    const msg = await got;
    stream.end();
    assert.equal(msg.results.length, 2);
    const [a, b] = msg.results;
    assert.equal(a.task_id, '9223372036854775809');
    assert.equal(a.error, '');
    assert.equal(a.costs.length, rows);
    assert.equal(a.costs[13], 6);
    assert.equal(b.task_id, '2');
    assert.equal(b.error, 'deadline passed before the task ran');
    assert.equal(b.picked, -1);

    await new Promise((resolve, reject) => c.controller.Shutdown({}, (err) => (err ? reject(err) : resolve())));
    const { code } = await p.exited;
    assert.equal(code, 0, p.stderr());
    // Its own socket is gone; the directory (the router's) is not.
    assert.deepEqual(fs.readdirSync(p.dir), []);
  } finally {
    c.plugin.close();
    c.controller.close();
    c.health.close();
    p.child.kill('SIGKILL');
    fs.rmSync(p.dir, { recursive: true, force: true });
  }
});

test('health answers SERVING for "plugin"; Classify and Events, not declared, answer UNIMPLEMENTED', async () => {
  const p = await start();
  const c = clients(p.addr);
  try {
    const h = await new Promise((resolve, reject) => c.health.Check({ service: 'plugin' }, (err, res) => (err ? reject(err) : resolve(res))));
    assert.equal(h.status, 'SERVING');
    const cl = await new Promise((resolve) => c.plugin.Classify({ instance: 'x' }, (err) => resolve(err)));
    assert.equal(cl.code, grpc.status.UNIMPLEMENTED);
    const events = c.plugin.Events();
    events.on('data', () => {});
    const ev = await new Promise((resolve) => {
      events.on('error', resolve);
      events.write({ batch_id: 1, instance: 'x', events: [] });
    });
    assert.equal(ev.code, grpc.status.UNIMPLEMENTED);
  } finally {
    c.plugin.close();
    c.controller.close();
    c.health.close();
    p.child.kill('SIGKILL');
    await p.exited;
    fs.rmSync(p.dir, { recursive: true, force: true });
  }
});

test('SIGTERM (the parent-death signal) exits 1 at once, removing its socket and nothing else', async () => {
  const p = await start();
  try {
    fs.writeFileSync(path.join(p.dir, 'not-mine'), 'x');
    p.child.kill('SIGTERM');
    const { code } = await p.exited;
    assert.equal(code, 1, p.stderr());
    assert.deepEqual(fs.readdirSync(p.dir), ['not-mine']);
    assert.match(p.stderr(), /"@message":"exiting".*"reason":"SIGTERM"/);
  } finally {
    p.child.kill('SIGKILL');
    fs.rmSync(p.dir, { recursive: true, force: true });
  }
});

test('without the cookie it explains itself on stderr, prints nothing on stdout and exits 1', async () => {
  const child = spawn(process.execPath, [SCRIPT], { env: {}, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (b) => { out += b; });
  child.stderr.on('data', (b) => { err += b; });
  const code = await new Promise((resolve) => child.on('close', resolve));
  assert.equal(code, 1);
  assert.equal(out, '');
  assert.match(err, /This is a Switchyard plugin/);
});
