#!/usr/bin/env node
// A Switchyard plugin in Node.js, written from docs/plugin-protocol.md
// (API version 1) alone, with no SDK: @grpc/grpc-js serves the services and
// @grpc/proto-loader reads the .proto files at run time.
//
// Component types (docs/plugin-protocol.md, section 8):
//   node-least-active  scorer: cost = active_weight * active_requests
//                      + waiting_weight * load_waiting (when known)
//   node-max-active    filter: keeps the rows with fewer than
//                      max_active_requests requests in flight
//
// Run it as a policy file's plugin block does (examples/policies/node-example.hcl)
// or through `router plugins check -- node examples/node-plugin/plugin.js`.
// Section numbers below are docs/plugin-protocol.md's.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PLUGIN_VERSION = require('./package.json').version;

// Section 2, step 1: the magic cookie.
const COOKIE_NAME = 'SWITCHYARD_PLUGIN';
const COOKIE_VALUE = '02131c040c44fb6342fb990f8fd29af6a7da02727dd67a7a8ec8c87382e54d8a';
// The API versions this plugin speaks (section 2, step 2).
const API_VERSIONS = [1];
// Section 4: every message in either direction may be up to 64 MiB.
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
// Section 8, "Inputs": the bit set of candidate columns a component reads.
const ACTIVE_REQUESTS = 1;
const LOAD = 4;

// ---------------------------------------------------------------- logging
// Section 7: one hclog JSON line per entry, on stderr only. The level comes
// from SWITCHYARD_PLUGIN_LOG_LEVEL, which the SDKs read too (the plugin gets
// it only when the policy's plugin block sets it in env).
const LEVELS = { trace: 0, debug: 1, info: 2, warn: 3, error: 4 };
const minLevel = LEVELS[(process.env.SWITCHYARD_PLUGIN_LOG_LEVEL || 'info').toLowerCase()] ?? LEVELS.info;

// Section 6: the router's end of stderr may be closed on the way out; Node
// ignores SIGPIPE already, and a failed write must not become an uncaught
// 'error' event.
process.stderr.on('error', () => {});
process.stdout.on('error', () => {});

function log(level, message, fields) {
  if (LEVELS[level] < minLevel) return;
  const entry = { '@level': level, '@message': message, '@module': 'node-plugin', '@timestamp': new Date().toISOString(), ...fields };
  try {
    // A JSON line is one line (JSON.stringify escapes newlines); keep it
    // well under the 4 KiB the router cuts at.
    let line = JSON.stringify(entry);
    if (line.length > 3000) {
      line = JSON.stringify({ '@level': level, '@message': String(message).slice(0, 1000), '@timestamp': entry['@timestamp'], cut: line.length });
    }
    process.stderr.write(line + '\n');
  } catch {
    // Nothing to do: logging must never take the plugin down.
  }
}

// Section 2, step 4: stdout carries the handshake line and nothing else.
// Anything a library prints with console.log goes to stderr instead.
for (const name of ['log', 'info', 'debug']) {
  console[name] = (...args) => log('info', args.map(String).join(' '));
}

process.on('uncaughtException', (err) => {
  log('error', 'uncaught exception', { error: String(err && err.stack || err) });
  process.exit(1);
});

// ---------------------------------------------------------- the protocol
// The protos, read at run time relative to this file (the plugin runs in
// the router's working directory, section 1). SWITCHYARD_PROTO_ROOT points
// elsewhere when this directory is copied out of the repository.
const repoRoot = process.env.SWITCHYARD_PROTO_ROOT || path.resolve(__dirname, '..', '..');
const PROTO_FILES = [
  path.join(repoRoot, 'shared/pluginproto/switchyard/plugin/v1/plugin.proto'),
  path.join(repoRoot, 'sdk/python/proto/health.proto'),
  path.join(repoRoot, 'sdk/python/proto/grpc_controller.proto'),
];
// No `longs` option: every 64-bit integer stays a protobufjs Long, exact
// (worker ids and task ids are above 2^53, section 8 "Ids are unsigned
// 64-bit"), and a task_id is echoed back as the Long it came as, never
// through a Number. `longs: String` would be exact too, but decoding a
// 4,096-row task with every column set then takes 15 ms instead of 2 ms
// (Long.toString for each of the 28,672 values), most of the router's
// default 20 ms call_timeout.
const packageDefinition = protoLoader.loadSync(PROTO_FILES, {
  keepCase: true,
  enums: String,
  defaults: true,
  oneofs: true,
});
const proto = grpc.loadPackageDefinition(packageDefinition);
const decideSerialize = packageDefinition['switchyard.plugin.v1.Plugin'].Decide.responseSerialize;

// ------------------------------------------------------------- the types
// Section 8, "Describe": what a policy file may use.
const TYPES = {
  'node-least-active': {
    kind: 'KIND_SCORER',
    inputs: ACTIVE_REQUESTS | LOAD,
    doc: 'Prefers the worker with the fewest requests in flight (the router\'s count), optionally ' +
      'adding the engine-reported queue length: cost = active_weight * active_requests + ' +
      'waiting_weight * load_waiting (0 when unknown). Written in Node.js from docs/plugin-protocol.md.',
    params: [
      { name: 'active_weight', type: 'PARAM_TYPE_NUMBER', required: false, default: { number: 1 },
        doc: 'Cost per request in flight on the worker; from 0 to 1e6.' },
      { name: 'waiting_weight', type: 'PARAM_TYPE_NUMBER', required: false, default: { number: 0 },
        doc: 'Cost per request waiting in the engine\'s queue; from 0 to 1e6. Above 0 the instance reads the LOAD columns.' },
    ],
  },
  'node-max-active': {
    kind: 'KIND_FILTER',
    inputs: ACTIVE_REQUESTS,
    doc: 'Drops workers with max_active_requests or more requests in flight (the router\'s count); ' +
      'when every worker is that busy the policy reports the request as filtered.',
    params: [
      { name: 'max_active_requests', type: 'PARAM_TYPE_INT', required: false, default: { int: '64' },
        doc: 'Workers with this many requests in flight or more are dropped; at least 1.' },
    ],
  },
};

// instances maps ConfigureRequest.instance to { name, type, kind, ...params }.
// A second Configure with the same name replaces it (section 8, "Configure").
const instances = new Map();

// paramValue reads one Value as the declared type, or returns
// { error } for a mix the doc says to refuse (section 8, "Types and values":
// accept an int where a number is wanted, refuse every other mix).
function paramValue(spec, value) {
  const kind = value && value.kind;
  switch (spec.type) {
    case 'PARAM_TYPE_NUMBER':
      if (kind === 'number') return { value: value.number };
      if (kind === 'int') return { value: num(value.int) };
      return { error: `${spec.name} must be a number, got ${kind || 'no value'}` };
    case 'PARAM_TYPE_INT':
      if (kind === 'int') return { value: BigInt(value.int.toString()) };
      return { error: `${spec.name} must be an integer, got ${kind || 'no value'}` };
    default:
      return { error: `${spec.name}: unsupported parameter type ${spec.type}` };
  }
}

// configure answers a ConfigureRequest with a ConfigureResponse: refusals
// are diagnostics naming the parameter, never gRPC errors.
function configure(req) {
  const type = TYPES[req.type];
  const diag = (param, summary, detail = '') => ({
    diagnostics: [{ param, summary: summary.toWellFormed(), detail: detail.toWellFormed() }],
  });
  if (!type) return diag('', `unknown component type ${JSON.stringify(req.type)}`, `this plugin declares ${Object.keys(TYPES).join(', ')}`);
  if (!['aggregated', 'prefill', 'decode'].includes(req.role)) {
    return diag('', `role ${JSON.stringify(req.role)} is not a worker role this ${req.type} serves`, 'aggregated, prefill or decode');
  }
  const diagnostics = [];
  const values = {};
  for (const name of Object.keys(req.params || {})) {
    if (!type.params.some((p) => p.name === name)) diagnostics.push({ param: name, summary: `unknown parameter ${name}`.toWellFormed(), detail: '' });
  }
  for (const spec of type.params) {
    const v = req.params && req.params[spec.name];
    const got = v ? paramValue(spec, v) : spec.default ? paramValue(spec, { ...spec.default, kind: Object.keys(spec.default)[0] }) : { value: undefined };
    if (got.error) {
      diagnostics.push({ param: spec.name, summary: got.error.toWellFormed(), detail: '' });
      continue;
    }
    values[spec.name] = got.value;
  }
  if (type.kind === 'KIND_SCORER') {
    for (const name of ['active_weight', 'waiting_weight']) {
      const x = values[name];
      if (x !== undefined && !(Number.isFinite(x) && x >= 0 && x <= 1e6)) {
        diagnostics.push({ param: name, summary: `${name} must be from 0 to 1e6, got ${x}`, detail: '' });
      }
    }
  } else if (values.max_active_requests !== undefined && values.max_active_requests < 1n) {
    diagnostics.push({ param: 'max_active_requests', summary: `max_active_requests must be at least 1, got ${values.max_active_requests}`, detail: '' });
  }
  if (diagnostics.length > 0) return { diagnostics, inputs: 0, events: false };

  const inst = { name: req.instance, type: req.type, kind: type.kind };
  let inputs = type.inputs;
  if (type.kind === 'KIND_SCORER') {
    inst.activeWeight = values.active_weight;
    inst.waitingWeight = values.waiting_weight;
    inputs = ACTIVE_REQUESTS | (inst.waitingWeight > 0 ? LOAD : 0);
  } else {
    // Beyond 2^53 requests in flight is unreachable: cap it to a Number.
    const max = values.max_active_requests;
    inst.maxActive = max > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(max);
  }
  instances.set(req.instance, inst);
  log('debug', 'configured', { instance: req.instance, type: req.type, role: req.role, inputs });
  return { diagnostics: [], inputs, events: false };
}

// num reads an int64 column entry or deadline (a Long; a string or number
// in tests) as a Number: exact up to 2^53, which request counts, queue
// lengths and nanosecond deadlines (to within a microsecond) fit.
function num(x) {
  return typeof x === 'object' && x !== null ? x.toNumber() : Number(x);
}

// componentError is a component's own error in the Go SDK's wording,
// `KIND "NAME": MESSAGE` (section 8, "Decide"), never mistaken for a panic.
function componentError(kind, name, message) {
  return `${kind} ${JSON.stringify(name)}: ${message}`;
}

// decideTask runs one DecideTask's stages (filters, then scorers; this
// plugin has no picker) over the rows as sent and returns its DecideResult.
function decideTask(task, nowNs) {
  const fail = (error) => ({ task_id: task.task_id, error: error.toWellFormed(), picked: -1 });
  // Section 4: a task whose deadline passed before it ran is answered with
  // an error at once. 0 means no deadline. A Number holds the nanoseconds
  // within a microsecond, which is enough for a comparison with Date.now().
  const deadline = num(task.deadline_unix_nano);
  if (deadline !== 0 && deadline <= nowNs) return fail('deadline passed before the task ran');

  const cols = task.candidates || {};
  const ids = cols.ids || [];
  const rows = ids.length;
  const active = cols.active_requests || [];
  const waiting = cols.load_waiting || [];

  const stages = [];
  for (const stage of task.stages || []) {
    const inst = instances.get(stage.instance);
    if (!inst) return fail(`unknown instance ${JSON.stringify(stage.instance)}`);
    stages.push({ inst, weight: stage.weight });
  }
  // Filters come first, then scorers (section 8: "zero or more filters,
  // then zero or more scorers, then at most one picker").
  let sawScorer = false;
  for (const { inst } of stages) {
    if (inst.kind === 'KIND_SCORER') sawScorer = true;
    else if (sawScorer) return fail(componentError('filter', inst.name, 'runs after a scorer in the task\'s stages'));
  }

  let kept = null; // null: every row (no filter ran)
  for (const { inst } of stages) {
    if (inst.kind !== 'KIND_FILTER') continue;
    if (active.length !== rows) return fail(componentError('filter', inst.name, `active_requests has ${active.length} entries for ${rows} rows`));
    const next = [];
    for (const row of kept || ids.keys()) {
      if (num(active[row]) < inst.maxActive) next.push(row);
    }
    kept = next;
    if (kept.length === 0) return { task_id: task.task_id, filtered_by: inst.name, picked: -1 };
  }

  let costs = null; // null: no scorer ran
  for (const { inst, weight } of stages) {
    if (inst.kind !== 'KIND_SCORER') continue;
    if (active.length !== rows) return fail(componentError('scorer', inst.name, `active_requests has ${active.length} entries for ${rows} rows`));
    const useWaiting = inst.waitingWeight > 0;
    if (useWaiting && waiting.length !== rows) return fail(componentError('scorer', inst.name, `load_waiting has ${waiting.length} entries for ${rows} rows`));
    const rowsLeft = kept || [...ids.keys()];
    if (costs === null) costs = new Array(rowsLeft.length).fill(0);
    for (let i = 0; i < rowsLeft.length; i++) {
      const row = rowsLeft[i];
      let c = inst.activeWeight * num(active[row]);
      // -1: the engine reported no queue length.
      if (useWaiting) c += inst.waitingWeight * Math.max(0, num(waiting[row]));
      costs[i] += c * weight;
      if (!Number.isFinite(costs[i])) {
        return fail(componentError('scorer', inst.name, `the cost of row ${row} is not finite (weight ${weight})`));
      }
    }
  }

  const result = { task_id: task.task_id, picked: -1 };
  // Send kept only when the task had a filter (empty means every row).
  if (kept !== null) result.kept = kept;
  if (costs !== null) result.costs = costs;
  return result;
}

// resultBytesBound is an upper bound of a DecideResult's encoded size
// inside DecideResults: tag and length prefix, task_id (10), picked (10),
// kept (5 per packed uint32), costs (8 per packed double), strings
// (3 bytes per UTF-16 unit at most).
function resultBytesBound(r) {
  return 48 + (r.kept ? r.kept.length * 5 : 0) + (r.costs ? r.costs.length * 8 : 0) +
    3 * ((r.error || '').length + (r.filtered_by || '').length);
}

// sendResults writes results as DecideResults messages of at most 64 MiB
// each (section 4). A result too large even alone is replaced by the
// error wording the router counts as "too large".
// maxBytes is MAX_MESSAGE_BYTES but in tests.
function sendResults(call, results, maxBytes = MAX_MESSAGE_BYTES) {
  const limit = maxBytes - 64; // the DecideResults message's own framing
  let batch = [];
  let size = 0;
  for (let r of results) {
    let n = resultBytesBound(r);
    if (n > limit) {
      const exact = decideSerialize({ results: [r] }).length;
      if (exact > maxBytes) {
        r = { task_id: r.task_id, error: `result of ${exact} bytes exceeds the ${maxBytes}-byte limit`, picked: -1 };
        n = resultBytesBound(r);
      } else {
        n = exact;
      }
    }
    if (batch.length > 0 && size + n > limit) {
      call.write({ results: batch });
      batch = [];
      size = 0;
    }
    batch.push(r);
    size += n;
  }
  if (batch.length > 0) call.write({ results: batch });
}

// decide serves one Decide stream: every DecideBatch is answered with
// exactly one DecideResult per task (section 8, "Decide"). The tasks are
// short and synchronous, so each batch is answered in order as it comes.
function decide(call) {
  let open = true;
  call.on('data', (batch) => {
    if (!open) return;
    const nowNs = Date.now() * 1e6;
    const results = [];
    for (const task of batch.tasks || []) {
      try {
        results.push(decideTask(task, nowNs));
      } catch (err) {
        results.push({ task_id: task.task_id, error: `plugin error: ${String(err && err.message || err)}`.toWellFormed(), picked: -1 });
      }
    }
    sendResults(call, results);
  });
  call.on('end', () => {
    if (!open) return;
    open = false;
    call.end();
  });
  call.on('cancelled', () => { open = false; });
  call.on('error', (err) => {
    open = false;
    log('debug', 'decide stream ended', { error: String(err && err.message || err) });
  });
}

function unimplemented(what) {
  return (call, callback) => {
    const err = { code: grpc.status.UNIMPLEMENTED, details: `${what}: this plugin declares no ${what === 'Classify' ? 'classifier' : 'event listener'}` };
    if (callback) callback(err);
    else call.emit('error', err); // grpc-js ends a server stream with the error's status
  };
}

// ------------------------------------------------------------ the server
let server = null;
let socketPath = null; // the socket this process created, and only that
let stopping = false;

// removeOwnSocket removes the socket file this process created. The
// directory (PLUGIN_UNIX_SOCKET_DIR) is the router's: it is left alone.
function removeOwnSocket() {
  if (!socketPath) return;
  try {
    fs.unlinkSync(socketPath);
  } catch {
    // Already gone (grpc-js unlinks it on a clean shutdown).
  }
  socketPath = null;
}

// die ends the process at once: on SIGTERM (the parent-death signal on
// Linux) and when the parent pid changes (section 6).
function die(why) {
  log('info', 'exiting', { reason: why });
  removeOwnSocket();
  process.exit(1);
}

// shutdown stops serving and exits promptly, for
// plugin.GRPCController/Shutdown (section 3).
function shutdown() {
  if (stopping) return;
  stopping = true;
  log('debug', 'shutdown requested');
  const exit = () => {
    removeOwnSocket();
    process.exit(0);
  };
  // Let the Shutdown answer go out; then stop whatever still runs.
  const force = setTimeout(() => {
    server.forceShutdown();
    exit();
  }, 200);
  server.tryShutdown(() => {
    clearTimeout(force);
    exit();
  });
}

function listen(callback) {
  const creds = grpc.ServerCredentials.createInsecure();
  const dir = process.env.PLUGIN_UNIX_SOCKET_DIR;
  if (dir) {
    // Section 2, step 3: a socket in PLUGIN_UNIX_SOCKET_DIR, named like
    // the Go SDK's (`plugin` and digits).
    const p = path.join(dir, `plugin${process.pid}`);
    server.bindAsync(`unix:${p}`, creds, (err) => {
      if (err) return callback(err);
      socketPath = p;
      callback(null, 'unix', p);
    });
    return;
  }
  // No socket directory: 127.0.0.1 on a port in the router's range.
  const min = Number(process.env.PLUGIN_MIN_PORT) || 10000;
  const max = Number(process.env.PLUGIN_MAX_PORT) || 25000;
  const tryPort = (port) => {
    if (port > max) return callback(new Error(`no free port in ${min}-${max}`));
    server.bindAsync(`127.0.0.1:${port}`, creds, (err, bound) => {
      if (err) return tryPort(port + 1);
      callback(null, 'tcp', `127.0.0.1:${bound}`);
    });
  };
  tryPort(min);
}

function main() {
  // Section 2, step 1: a process the router did not start explains itself
  // on stderr and exits 1.
  if (process.env[COOKIE_NAME] !== COOKIE_VALUE) {
    process.stderr.write('This is a Switchyard plugin: the router starts it (a policy file\'s plugin block, ' +
      'or `router plugins check -- node plugin.js`). It is not meant to be run by hand.\n');
    process.exit(1);
  }

  // Section 2, step 2: the highest version both sides speak; none in
  // common: print ours anyway, and the router refuses it.
  const offered = (process.env.PLUGIN_PROTOCOL_VERSIONS || '').split(',').map((s) => Number(s.trim()));
  const common = API_VERSIONS.filter((v) => offered.includes(v));
  const version = common.length > 0 ? Math.max(...common) : API_VERSIONS[API_VERSIONS.length - 1];

  server = new grpc.Server({
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
  });
  server.addService(proto.switchyard.plugin.v1.Plugin.service, {
    Describe: (call, callback) => {
      callback(null, {
        plugin_version: PLUGIN_VERSION,
        api_versions: API_VERSIONS,
        types: Object.entries(TYPES).map(([name, t]) => ({ name, kind: t.kind, inputs: t.inputs, params: t.params, doc: t.doc })),
      });
    },
    Configure: (call, callback) => {
      try {
        callback(null, configure(call.request));
      } catch (err) {
        callback({ code: grpc.status.INTERNAL, details: String(err && err.message || err).toWellFormed() });
      }
    },
    Decide: decide,
    Classify: unimplemented('Classify'),
    Events: unimplemented('Events'),
  });
  // Section 3: the health check for the service name "plugin".
  server.addService(proto.grpc.health.v1.Health.service, {
    Check: (call, callback) => {
      const name = call.request.service;
      if (name !== 'plugin' && name !== '') {
        return callback({ code: grpc.status.NOT_FOUND, details: `unknown service ${JSON.stringify(name)}`.toWellFormed() });
      }
      callback(null, { status: stopping ? 'NOT_SERVING' : 'SERVING' });
    },
  });
  server.addService(proto.plugin.GRPCController.service, {
    Shutdown: (call, callback) => {
      callback(null, {});
      setImmediate(shutdown);
    },
  });

  listen((err, network, addr) => {
    if (err) {
      log('error', 'cannot listen', { error: String(err.message || err) });
      process.exit(1);
    }
    // Section 2, step 4: one line, flushed (a write to a pipe is
    // synchronous in Node on Linux).
    process.stdout.write(`1|${version}|${network}|${addr}|grpc\n`);
    log('info', 'serving', { version: PLUGIN_VERSION, network, addr });
  });

  // Section 6: SIGTERM is the parent-death signal; a changed parent pid
  // means the router is gone where there is none.
  process.on('SIGTERM', () => die('SIGTERM'));
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) die(`parent ${parent} is gone`);
  }, 250).unref();
}

if (require.main === module) {
  main();
} else {
  module.exports = { configure, decideTask, sendResults, decideSerialize, TYPES, COOKIE_VALUE, MAX_MESSAGE_BYTES };
}
