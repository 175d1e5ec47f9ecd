// check.mjs: the official OpenAI and Anthropic Node SDKs (pinned in
// package.json, installed by `make sdk-deps`) against an OpenAI- and
// Anthropic-compatible server, `router serve` in front of engines:
//
//   node scripts/sdk-check/check.mjs --base-url http://127.0.0.1:8080 [--model mock] [--direct]
//
// --direct: the base URL is one engine, not the router; the router's
// worker header is not required (every answer counts as one worker's), to
// tell an engine's (or the mock engine's) answers from the router's.
//
// Each step calls the SDK as an application would, asserts real values of
// the answer (ids, usage counts, the streamed text against the
// concatenated deltas and against the same request not streamed, which a
// greedy engine answers alike) and prints one line:
//
//   PASS <step> <what it saw>
//   FAIL <step>: <why>
//
// Every step runs, also after a failure; a step that needs an earlier one
// fails naming it. The last line is "ok <n> steps" (exit 0) or
// "FAILED <step>, <step>, ..." (exit 1). Usage errors exit 2. The steps, in
// order, are STEPS below; cmd/router's TestServeE2ESDKs runs this script
// against `router serve` over three mock engines and reports each step as a
// subtest.
//
// The wire formats the steps check are those of the APIs' references:
// OpenAI's Chat Completions, Embeddings, Models and Responses
// (https://platform.openai.com/docs/api-reference), Anthropic's Messages
// (https://docs.anthropic.com/en/api/messages and .../messages-streaming),
// as the SDKs parse them (openai 6.30.1, @anthropic-ai/sdk 1.17.0).
// openai 7.x needs Node.js 22 (its package.json "engines"); Node.js 20 is
// the project's floor, hence 6.30.1.
//
// The router's worker header (X-Switchyard-Worker, docs/serve.md) is read
// from the raw HTTP answer through the SDKs' withResponse().

import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

/** The steps, in the order they run and print. */
export const STEPS = [
  'models.list',
  'models.retrieve',
  'models.retrieve unknown',
  'chat.completions.create',
  'chat.completions.create stream',
  'embeddings.create',
  'embeddings.create float',
  'responses.create',
  'responses.create previous_response_id',
  'responses.create stream',
  'responses.create stream previous_response_id',
  'messages.create',
  'messages.create stream',
];

const WORKER_HEADER = 'x-switchyard-worker';
const MAX_TOKENS = 6;

function usage(msg) {
  console.error(`check.mjs: ${msg}\nusage: node check.mjs --base-url URL [--model NAME] [--direct]`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { baseURL: '', model: 'mock', direct: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--base-url') o.baseURL = val().replace(/\/+$/, '');
    else if (a === '--model') o.model = val();
    else if (a === '--direct') o.direct = true;
    else usage(`unknown argument ${a}`);
  }
  if (!/^https?:\/\/[^/]+$/.test(o.baseURL)) usage('--base-url must be http(s)://host:port (no path)');
  return o;
}

class CheckError extends Error {}

function assert(cond, msg) {
  if (!cond) throw new CheckError(msg);
}

function posInt(v, what) {
  assert(Number.isInteger(v) && v > 0, `${what} = ${JSON.stringify(v)}, want an integer > 0`);
  return v;
}

function nonEmpty(v, what) {
  assert(typeof v === 'string' && v.length > 0, `${what} = ${JSON.stringify(v)}, want a non-empty string`);
  return v;
}

let direct = false;

/** worker returns the router's worker header of a raw answer ("direct"
 * with --direct when there is none). */
function worker(response, what) {
  if (direct && !response.headers.get(WORKER_HEADER)) return 'direct';
  return nonEmpty(response.headers.get(WORKER_HEADER), `${what}: header ${WORKER_HEADER}`);
}

/** responseText is the text of a Responses API answer's message outputs. */
function responseText(r) {
  let s = '';
  for (const item of r.output ?? []) {
    if (item.type !== 'message') continue;
    for (const part of item.content ?? []) {
      if (part.type === 'output_text') s += part.text;
    }
  }
  return s;
}

function short(s) {
  return JSON.stringify(s.length > 40 ? s.slice(0, 40) + '...' : s);
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  direct = o.direct;
  // No retries: a failure shows as itself. The API keys are placeholders
  // (the router does not check them; the SDKs require one).
  const openai = new OpenAI({ baseURL: `${o.baseURL}/v1`, apiKey: 'sk-switchyard-check', maxRetries: 0, timeout: 30_000 });
  const anthropic = new Anthropic({ baseURL: o.baseURL, apiKey: 'sk-ant-switchyard-check', maxRetries: 0, timeout: 30_000 });
  const model = o.model;
  const state = {};
  const failed = [];

  const steps = {
    'models.list': async () => {
      const page = await openai.models.list();
      const models = page.data;
      assert(Array.isArray(models) && models.length > 0, 'no models listed');
      const m = models.find((x) => x.id === model);
      assert(m, `model ${model} not listed (got ${models.map((x) => x.id).join(', ')})`);
      assert(m.object === 'model', `object = ${JSON.stringify(m.object)}, want "model"`);
      nonEmpty(m.owned_by, 'owned_by');
      state.listed = m;
      return `${models.length} model(s), ${model} owned_by ${m.owned_by}` + (m.max_model_len ? ` max_model_len ${m.max_model_len}` : '');
    },

    'models.retrieve': async () => {
      const m = await openai.models.retrieve(model);
      assert(m.id === model, `id = ${JSON.stringify(m.id)}, want ${JSON.stringify(model)}`);
      assert(m.object === 'model', `object = ${JSON.stringify(m.object)}, want "model"`);
      assert(state.listed, 'needs models.list, which failed');
      // The same entry as the list's: GET /v1/models/{id} answers from
      // the same view.
      const a = JSON.stringify(m), b = JSON.stringify(state.listed);
      assert(a === b, `retrieved ${a}, listed ${b}`);
      state.retrieved = true;
      return `${m.id}, equal to its models.list entry`;
    },

    'models.retrieve unknown': async () => {
      const id = 'no-such-model-switchyard';
      // A 404 for an unknown id means something only where a known id
      // is answered: a server without the route 404s both.
      assert(state.retrieved, 'needs models.retrieve, which failed');
      try {
        const m = await openai.models.retrieve(id);
        throw new CheckError(`retrieve(${id}) answered ${JSON.stringify(m)}, want 404`);
      } catch (e) {
        if (e instanceof CheckError) throw e;
        assert(e instanceof OpenAI.NotFoundError, `retrieve(${id}) failed with ${e.constructor.name} ${e.status ?? ''}: ${e.message}, want NotFoundError (404)`);
        assert(e.error && typeof e.error.message === 'string' && e.error.message.length > 0,
          `404 body ${JSON.stringify(e.error)} lacks OpenAI's error.message`);
        // OpenAI ("The model 'ID' does not exist ...") and vLLM ("The
        // model `ID` does not exist.") both name the model.
        assert(e.error.message.includes(id), `404 message ${JSON.stringify(e.error.message)} does not name the model ${id}`);
        return `404 NotFoundError: ${short(e.error.message)}`;
      }
    },

    'chat.completions.create': async () => {
      const { data: c, response } = await openai.chat.completions.create({
        model, max_tokens: MAX_TOKENS, temperature: 0,
        messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Name three rivers of Europe.' }],
      }).withResponse();
      const w = worker(response, 'chat');
      nonEmpty(c.id, 'id');
      assert(c.object === 'chat.completion', `object = ${JSON.stringify(c.object)}`);
      assert(c.choices.length === 1, `${c.choices.length} choices, want 1`);
      const text = nonEmpty(c.choices[0].message.content, 'choices[0].message.content');
      const u = c.usage;
      assert(u, 'no usage');
      posInt(u.prompt_tokens, 'usage.prompt_tokens');
      posInt(u.completion_tokens, 'usage.completion_tokens');
      assert(u.total_tokens === u.prompt_tokens + u.completion_tokens, `usage.total_tokens ${u.total_tokens} != ${u.prompt_tokens} + ${u.completion_tokens}`);
      if (c.choices[0].finish_reason === 'length') {
        assert(u.completion_tokens === MAX_TOKENS, `finish_reason length with ${u.completion_tokens} completion tokens, max_tokens ${MAX_TOKENS}`);
      }
      state.chatText = text;
      return `id ${c.id} worker ${w} usage ${u.prompt_tokens}+${u.completion_tokens} text ${short(text)}`;
    },

    'chat.completions.create stream': async () => {
      const { data: stream, response } = await openai.chat.completions.create({
        model, max_tokens: MAX_TOKENS, temperature: 0, stream: true, stream_options: { include_usage: true },
        messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Name three rivers of Europe.' }],
      }).withResponse();
      const w = worker(response, 'chat stream');
      let text = '', chunks = 0, id = '', u = null, finish = null;
      for await (const ch of stream) {
        chunks++;
        nonEmpty(ch.id, `chunk ${chunks} id`);
        if (!id) id = ch.id;
        assert(ch.id === id, `chunk ${chunks} id ${ch.id} != first chunk's ${id}`);
        assert(ch.object === 'chat.completion.chunk', `chunk ${chunks} object = ${JSON.stringify(ch.object)}`);
        for (const c of ch.choices) {
          text += c.delta?.content ?? '';
          if (c.finish_reason) finish = c.finish_reason;
        }
        if (ch.usage) u = ch.usage;
      }
      assert(chunks > 1, `${chunks} chunks, want several`);
      assert(finish, 'no chunk with a finish_reason');
      assert(u, 'no usage chunk (stream_options.include_usage)');
      posInt(u.prompt_tokens, 'usage.prompt_tokens');
      posInt(u.completion_tokens, 'usage.completion_tokens');
      nonEmpty(text, 'the concatenated deltas');
      assert(state.chatText !== undefined, 'needs chat.completions.create, which failed');
      assert(text === state.chatText, `streamed text ${JSON.stringify(text)} != the non-streamed ${JSON.stringify(state.chatText)}`);
      return `id ${id} worker ${w} ${chunks} chunks usage ${u.prompt_tokens}+${u.completion_tokens}, deltas equal the non-streamed text`;
    },

    'embeddings.create': async () => {
      // The SDK asks for base64 unless told otherwise and decodes it to
      // float32 (openai/resources/embeddings.mjs).
      const input = ['The quick brown fox.', 'Jumps over the lazy dog, twice.'];
      const { data: e, response } = await openai.embeddings.create({ model, input }).withResponse();
      const w = worker(response, 'embeddings');
      assert(e.object === 'list', `object = ${JSON.stringify(e.object)}, want "list"`);
      assert(e.data.length === input.length, `${e.data.length} embeddings for ${input.length} inputs`);
      let dim = 0;
      e.data.forEach((d, i) => {
        assert(d.object === 'embedding', `data[${i}].object = ${JSON.stringify(d.object)}`);
        assert(d.index === i, `data[${i}].index = ${d.index}`);
        const v = Array.from(d.embedding);
        assert(v.length > 0, `data[${i}].embedding is empty`);
        assert(v.every(Number.isFinite), `data[${i}].embedding has a non-finite value`);
        assert(v.some((x) => x !== 0), `data[${i}].embedding is all zeros`);
        if (i === 0) dim = v.length;
        assert(v.length === dim, `data[${i}] has ${v.length} dimensions, data[0] ${dim}`);
      });
      posInt(e.usage?.prompt_tokens, 'usage.prompt_tokens');
      state.embeddings = e.data.map((d) => Array.from(d.embedding));
      state.embedInput = input;
      return `worker ${w} ${e.data.length} x ${dim} (base64), usage.prompt_tokens ${e.usage.prompt_tokens}`;
    },

    'embeddings.create float': async () => {
      assert(state.embeddings, 'needs embeddings.create, which failed');
      const { data: e, response } = await openai.embeddings.create({ model, input: state.embedInput, encoding_format: 'float' }).withResponse();
      const w = worker(response, 'embeddings float');
      assert(e.data.length === state.embeddings.length, `${e.data.length} embeddings, want ${state.embeddings.length}`);
      e.data.forEach((d, i) => {
        assert(Array.isArray(d.embedding), `data[${i}].embedding is not a JSON array of floats`);
        const b64 = state.embeddings[i];
        assert(d.embedding.length === b64.length, `data[${i}] has ${d.embedding.length} dimensions, base64 gave ${b64.length}`);
        // The same input, float32 on the wire in base64: equal within
        // float32 rounding.
        d.embedding.forEach((x, j) => {
          assert(Math.abs(x - b64[j]) <= 1e-6 * Math.max(1, Math.abs(x)), `data[${i}][${j}] = ${x} as float, ${b64[j]} as base64`);
        });
      });
      posInt(e.usage?.prompt_tokens, 'usage.prompt_tokens');
      return `worker ${w} ${e.data.length} x ${e.data[0].embedding.length} (float), equal to the base64 answer`;
    },

    'responses.create': async () => {
      const { data: r, response } = await openai.responses.create({
        model, input: 'Name three rivers of Europe.', instructions: 'You are a helpful assistant.',
        max_output_tokens: MAX_TOKENS, temperature: 0,
      }).withResponse();
      const w = worker(response, 'responses');
      nonEmpty(r.id, 'id');
      assert(r.object === 'response', `object = ${JSON.stringify(r.object)}, want "response"`);
      assert(r.status === 'completed' || r.status === 'incomplete', `status = ${JSON.stringify(r.status)}`);
      const text = nonEmpty(responseText(r), 'the output message text');
      assert(r.output_text === text, `output_text ${JSON.stringify(r.output_text)} != the output message text ${JSON.stringify(text)}`);
      const u = r.usage;
      assert(u, 'no usage');
      posInt(u.input_tokens, 'usage.input_tokens');
      posInt(u.output_tokens, 'usage.output_tokens');
      assert(u.total_tokens === u.input_tokens + u.output_tokens, `usage.total_tokens ${u.total_tokens} != ${u.input_tokens} + ${u.output_tokens}`);
      state.resp = { id: r.id, worker: w, text };
      return `id ${r.id} worker ${w} usage ${u.input_tokens}+${u.output_tokens} text ${short(text)}`;
    },

    'responses.create previous_response_id': async () => {
      assert(state.resp, 'needs responses.create, which failed');
      // Two follow-ups in a chain: each must reach the engine that holds
      // the response it continues (the first's).
      let prev = state.resp.id;
      const ids = [prev];
      for (const turn of ['And three of Asia?', 'And one of Africa?']) {
        const { data: r, response } = await openai.responses.create({
          model, input: turn, previous_response_id: prev, max_output_tokens: MAX_TOKENS, temperature: 0,
        }).withResponse();
        const w = worker(response, `follow-up of ${prev}`);
        assert(w === state.resp.worker, `follow-up of ${prev} served by ${w}, the first response by ${state.resp.worker}`);
        nonEmpty(r.id, 'id');
        assert(!ids.includes(r.id), `follow-up id ${r.id} repeats an earlier id`);
        posInt(r.usage?.input_tokens, 'usage.input_tokens');
        posInt(r.usage?.output_tokens, 'usage.output_tokens');
        nonEmpty(responseText(r), 'the output message text');
        ids.push(r.id);
        prev = r.id;
      }
      return `${ids.join(' -> ')} all on worker ${state.resp.worker}`;
    },

    'responses.create stream': async () => {
      const { data: stream, response } = await openai.responses.create({
        model, input: 'Name three rivers of Europe.', instructions: 'You are a helpful assistant.',
        max_output_tokens: MAX_TOKENS, temperature: 0, stream: true,
      }).withResponse();
      const w = worker(response, 'responses stream');
      let deltas = '', created = null, completed = null, n = 0, lastSeq = -1;
      const types = new Set();
      for await (const ev of stream) {
        n++;
        types.add(ev.type);
        assert(Number.isInteger(ev.sequence_number) && ev.sequence_number > lastSeq,
          `event ${n} (${ev.type}) sequence_number ${ev.sequence_number} after ${lastSeq}`);
        lastSeq = ev.sequence_number;
        if (ev.type === 'response.created') created = ev.response;
        else if (ev.type === 'response.output_text.delta') deltas += ev.delta;
        else if (ev.type === 'response.completed' || ev.type === 'response.incomplete') completed = ev.response;
        else if (ev.type === 'response.failed' || ev.type === 'error') throw new CheckError(`event ${ev.type}: ${JSON.stringify(ev)}`);
      }
      assert(created, `no response.created event (got ${[...types].join(', ')})`);
      assert(completed, `no response.completed event (got ${[...types].join(', ')})`);
      nonEmpty(created.id, 'response.created id');
      assert(completed.id === created.id, `response.completed id ${completed.id} != response.created id ${created.id}`);
      nonEmpty(deltas, 'the concatenated output_text deltas');
      const final = responseText(completed);
      assert(deltas === final, `concatenated deltas ${JSON.stringify(deltas)} != response.completed's text ${JSON.stringify(final)}`);
      posInt(completed.usage?.input_tokens, 'response.completed usage.input_tokens');
      posInt(completed.usage?.output_tokens, 'response.completed usage.output_tokens');
      assert(state.resp, 'needs responses.create, which failed');
      assert(deltas === state.resp.text, `streamed text ${JSON.stringify(deltas)} != the non-streamed ${JSON.stringify(state.resp.text)}`);
      state.respStream = { id: created.id, worker: w };
      return `id ${created.id} worker ${w} ${n} events usage ${completed.usage.input_tokens}+${completed.usage.output_tokens}, deltas equal the completed and the non-streamed text`;
    },

    'responses.create stream previous_response_id': async () => {
      assert(state.respStream, 'needs responses.create stream, which failed');
      // The id learnt from a streamed answer: a streamed follow-up.
      const { data: stream, response } = await openai.responses.create({
        model, input: 'And three of Asia?', previous_response_id: state.respStream.id,
        max_output_tokens: MAX_TOKENS, temperature: 0, stream: true,
      }).withResponse();
      const w = worker(response, 'streamed follow-up');
      let completed = null, deltas = '';
      for await (const ev of stream) {
        if (ev.type === 'response.output_text.delta') deltas += ev.delta;
        else if (ev.type === 'response.completed' || ev.type === 'response.incomplete') completed = ev.response;
        else if (ev.type === 'response.failed' || ev.type === 'error') throw new CheckError(`event ${ev.type}: ${JSON.stringify(ev)}`);
      }
      assert(w === state.respStream.worker, `follow-up of ${state.respStream.id} served by ${w}, the streamed response by ${state.respStream.worker}`);
      assert(completed, 'no response.completed event');
      assert(completed.id !== state.respStream.id, `follow-up id ${completed.id} repeats its previous response's`);
      nonEmpty(deltas, 'the concatenated output_text deltas');
      return `${state.respStream.id} -> ${completed.id} on worker ${w}`;
    },

    'messages.create': async () => {
      const { data: m, response } = await anthropic.messages.create({
        model, max_tokens: MAX_TOKENS, temperature: 0, system: 'You are a helpful assistant.',
        messages: [{ role: 'user', content: 'Name three rivers of Europe.' }],
      }).withResponse();
      const w = worker(response, 'messages');
      nonEmpty(m.id, 'id');
      assert(m.type === 'message', `type = ${JSON.stringify(m.type)}, want "message"`);
      assert(m.role === 'assistant', `role = ${JSON.stringify(m.role)}, want "assistant"`);
      const text = nonEmpty(m.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), 'the text content blocks');
      posInt(m.usage?.input_tokens, 'usage.input_tokens');
      posInt(m.usage?.output_tokens, 'usage.output_tokens');
      nonEmpty(m.stop_reason, 'stop_reason');
      if (m.stop_reason === 'max_tokens') {
        assert(m.usage.output_tokens === MAX_TOKENS, `stop_reason max_tokens with ${m.usage.output_tokens} output tokens, max_tokens ${MAX_TOKENS}`);
      }
      state.msgText = text;
      return `id ${m.id} worker ${w} usage ${m.usage.input_tokens}+${m.usage.output_tokens} stop_reason ${m.stop_reason} text ${short(text)}`;
    },

    'messages.create stream': async () => {
      const { data: stream, response } = await anthropic.messages.create({
        model, max_tokens: MAX_TOKENS, temperature: 0, system: 'You are a helpful assistant.', stream: true,
        messages: [{ role: 'user', content: 'Name three rivers of Europe.' }],
      }).withResponse();
      const w = worker(response, 'messages stream');
      const seen = [];
      let start = null, text = '', outTokens = 0, stop = null, n = 0;
      for await (const ev of stream) {
        n++;
        seen.push(ev.type);
        switch (ev.type) {
          case 'message_start':
            assert(n === 1, `message_start is event ${n}, want the first`);
            start = ev.message;
            break;
          case 'content_block_delta':
            if (ev.delta.type === 'text_delta') text += ev.delta.text;
            break;
          case 'message_delta':
            outTokens = ev.usage?.output_tokens ?? 0;
            stop = ev.delta?.stop_reason ?? null;
            break;
        }
      }
      assert(start, `no message_start event (got ${seen.join(', ')})`);
      nonEmpty(start.id, 'message_start message.id');
      posInt(start.usage?.input_tokens, 'message_start usage.input_tokens');
      for (const t of ['content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta']) {
        assert(seen.includes(t), `no ${t} event (got ${seen.join(', ')})`);
      }
      assert(seen[seen.length - 1] === 'message_stop', `last event ${seen[seen.length - 1]}, want message_stop`);
      posInt(outTokens, 'message_delta usage.output_tokens');
      nonEmpty(stop, 'message_delta stop_reason');
      nonEmpty(text, 'the concatenated text deltas');
      assert(state.msgText !== undefined, 'needs messages.create, which failed');
      assert(text === state.msgText, `streamed text ${JSON.stringify(text)} != the non-streamed ${JSON.stringify(state.msgText)}`);
      return `id ${start.id} worker ${w} ${n} events usage ${start.usage.input_tokens}+${outTokens}, deltas equal the non-streamed text`;
    },
  };

  for (const name of STEPS) {
    try {
      const what = await steps[name]();
      console.log(`PASS ${name} ${what}`);
    } catch (e) {
      const why = e instanceof CheckError ? e.message
        : `${e.constructor?.name ?? 'Error'}${e.status ? ` ${e.status}` : ''}: ${e.message}`;
      console.log(`FAIL ${name}: ${why.replace(/\s*\n\s*/g, ' ')}`);
      failed.push(name);
    }
  }
  if (failed.length > 0) {
    console.log(`FAILED ${failed.join(', ')}`);
    process.exit(1);
  }
  console.log(`ok ${STEPS.length} steps`);
}

await main();
