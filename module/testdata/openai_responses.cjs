// Runs the Responses API's background workflow through the gateway with the official openai
// SDK and prints what it saw as JSON.
// Usage: node openai_responses.cjs run <baseURL>
//   background: responses.create({background: true}) answered queued, retrieve until completed
//   stream:     create({background: true, stream: true}), dropped after a few deltas, resumed
//               with responses.retrieve(id, {stream: true, starting_after})
//   cancel:     a long response cancelled twice; another API key's retrieve is a 404
// Usage: node openai_responses.cjs resume <baseURL> <other baseURL>
//   a stream created on one replica, dropped after three deltas, resumed on another
// Usage: node openai_responses.cjs unwrap <secret> <payload file> <headers file>
//   webhooks.unwrap of a delivered event, printed.
const fs = require('fs');
const { OpenAI } = require('openai');

// dropAndResume creates a streamed background response through client, drops it after three
// deltas and resumes it through resumer with starting_after.
async function dropAndResume(client, resumer, input) {
  const stream = await client.responses.create({ model: 'demo', input, background: true, stream: true },
    { headers: { 'X-Mock-Chunk-Delay': '30ms' } });
  const first = [];
  let id = '';
  for await (const ev of stream) {
    first.push({ type: ev.type, seq: ev.sequence_number, delta: ev.delta });
    if (ev.response) id = ev.response.id;
    if (ev.type === 'response.output_text.delta' && first.filter((e) => e.delta).length === 3) break;
  }
  const last = first[first.length - 1].seq;
  const resumed = await resumer.responses.retrieve(id, { stream: true, starting_after: last });
  const rest = [];
  for await (const ev of resumed) {
    rest.push({ type: ev.type, seq: ev.sequence_number, delta: ev.delta, id: ev.response ? ev.response.id : undefined });
  }
  return { id, first, rest };
}

async function resume(baseURL, otherURL) {
  const client = new OpenAI({ baseURL, apiKey: 'sk-owner', maxRetries: 0 });
  const elsewhere = new OpenAI({ baseURL: otherURL, apiKey: 'sk-owner', maxRetries: 0 });
  return { stream: await dropAndResume(client, elsewhere, 'one two three four five six seven eight') };
}

async function run(baseURL) {
  const client = new OpenAI({ baseURL, apiKey: 'sk-owner', maxRetries: 0 });
  const other = new OpenAI({ baseURL, apiKey: 'sk-other', maxRetries: 0 });
  const out = {};

  const created = await client.responses.create({ model: 'demo', input: 'poll me please', background: true });
  let r = created;
  const statuses = [];
  while (r.status === 'queued' || r.status === 'in_progress') {
    statuses.push(r.status);
    await new Promise((res) => setTimeout(res, 20));
    r = await client.responses.retrieve(created.id);
  }
  out.background = { created: { id: created.id, status: created.status, background: created.background },
    final: { id: r.id, status: r.status, text: r.output_text, usage: r.usage }, statuses };

  out.stream = await dropAndResume(client, client, 'one two three four five six seven eight');

  const long = await client.responses.create({ model: 'demo', input: 'a long one', background: true },
    { headers: { 'X-Mock-Latency': '30s' } });
  for (let s = long.status; s === 'queued'; s = (await client.responses.retrieve(long.id)).status) {
    await new Promise((res) => setTimeout(res, 20));
  }
  const c1 = await client.responses.cancel(long.id);
  const c2 = await client.responses.cancel(long.id);
  const after = await client.responses.retrieve(long.id);
  out.cancel = { id: long.id, first: c1.status, second: c2.status, secondID: c2.id, after: after.status };

  try {
    await other.responses.retrieve(created.id);
    out.otherScope = 200;
  } catch (e) {
    out.otherScope = e.status;
  }
  return out;
}

async function unwrap(secret, payloadFile, headersFile) {
  const client = new OpenAI({ apiKey: 'sk-owner', webhookSecret: secret });
  const event = await client.webhooks.unwrap(fs.readFileSync(payloadFile, 'utf8'), JSON.parse(fs.readFileSync(headersFile, 'utf8')));
  let forged = 'accepted';
  try {
    await client.webhooks.unwrap(fs.readFileSync(payloadFile, 'utf8').replace('resp_', 'resp_x'), JSON.parse(fs.readFileSync(headersFile, 'utf8')));
  } catch (e) {
    forged = e.constructor.name;
  }
  return { event, forged };
}

const [mode, ...args] = process.argv.slice(2);
({ run, resume, unwrap })[mode](...args).then(
  (out) => process.stdout.write(JSON.stringify(out)),
  (err) => { console.error(err); process.exit(1); },
);
