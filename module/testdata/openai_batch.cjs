// Runs the batch workflow through the gateway with the official openai SDK and prints what it
// saw as JSON. Usage: node openai_batch.cjs <baseURL> <dir>
//   run:      files.create + batches.create + retrieve until final + files.content (output and
//             errors), lines whose prompt says "reject" failing upstream with 400
//   scope:    another API key (another scope) retrieving the batch and the file: 404s
//   invalid:  a file with bad lines: the batch fails, its errors naming each line
//   cancel:   slow lines (the test's upstream holds prompts saying "slow" 200 ms), cancelled
//             once two have completed
const fs = require('fs');
const path = require('path');
const { OpenAI, toFile } = require('openai');

const [baseURL, dir] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'sk-owner', maxRetries: 0 });
const other = new OpenAI({ baseURL, apiKey: 'sk-other', maxRetries: 0 });
const final = new Set(['completed', 'failed', 'expired', 'cancelled']);

function line(id, prompt, url = '/v1/chat/completions') {
  return JSON.stringify({ custom_id: id, method: 'POST', url,
    body: { model: 'demo', messages: [{ role: 'user', content: prompt }] } });
}

async function upload(name, lines) {
  const file = path.join(dir, name);
  fs.writeFileSync(file, lines.join('\n') + '\n');
  return client.files.create({ file: fs.createReadStream(file), purpose: 'batch' });
}

async function untilFinal(id, seen) {
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (seen) seen.add(b.status);
    if (final.has(b.status)) return b;
    await new Promise((r) => setTimeout(r, 25));
  }
}

async function content(id) {
  if (!id) return [];
  const res = await client.files.content(id);
  const text = await res.text();
  return text.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

async function run() {
  const lines = [];
  for (let i = 1; i <= 12; i++) lines.push(line(`req-${i}`, i % 4 === 0 ? `reject ${i}` : `sdk ${i}`));
  const file = await upload('run.jsonl', lines);
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions',
    completion_window: '24h', metadata: { job: 'nightly' } });
  const seen = new Set([created.status]);
  const b = await untilFinal(created.id, seen);
  const listed = await client.batches.list({ limit: 10 });
  const fetched = await client.files.retrieve(file.id);
  return { file, created, batch: b, statuses: [...seen], output: await content(b.output_file_id),
    errors: await content(b.error_file_id), listed: listed.data.map((x) => x.id), fetched };
}

async function status(fn) {
  try { await fn(); return 200; } catch (e) { return e.status || String(e); }
}

async function scope(r) {
  return { batch: await status(() => other.batches.retrieve(r.batch.id)),
    file: await status(() => other.files.retrieve(r.file.id)),
    content: await status(() => other.files.content(r.batch.output_file_id)),
    cancel: await status(() => other.batches.cancel(r.batch.id)),
    list: (await other.batches.list()).data.length };
}

async function invalid() {
  const file = await upload('invalid.jsonl', [
    line('a', 'fine'), 'not json', JSON.stringify({ method: 'POST', url: '/v1/chat/completions', body: {} }),
    line('a', 'again'), line('d', 'elsewhere', '/v1/embeddings'),
  ]);
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  return untilFinal(created.id);
}

async function cancel() {
  const lines = [];
  for (let i = 1; i <= 30; i++) lines.push(line(`slow-${i}`, `slow ${i}`));
  const file = await upload('cancel.jsonl', lines);
  const created = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions',
    completion_window: '24h' });
  for (;;) {
    const b = await client.batches.retrieve(created.id);
    if (b.request_counts.completed >= 2) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const cancelling = await client.batches.cancel(created.id);
  const b = await untilFinal(created.id);
  return { cancelling, batch: b, output: await content(b.output_file_id), errors: await content(b.error_file_id) };
}

async function main() {
  const r = await run();
  const out = { run: r, scope: await scope(r), invalid: await invalid(), cancel: await cancel() };
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
