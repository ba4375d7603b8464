// Streams a chat completion through the gateway with the official openai SDK and an
// Idempotency-Key, drops the stream after four chunks, retries with the same key, and prints
// what the retry got as JSON. Usage: node openai_stream.cjs <baseURL> <key> <prompt>
const { OpenAI } = require('openai');

const [baseURL, key, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'sk-test', maxRetries: 0 });
const params = { model: 'demo', stream: true, messages: [{ role: 'user', content: prompt }] };
const headers = { 'Idempotency-Key': key };

async function main() {
  const controller = new AbortController();
  const first = await client.chat.completions.create(params, { headers, signal: controller.signal });
  let firstChunks = 0;
  try {
    for await (const chunk of first) {
      firstChunks++;
      if (firstChunks === 4) {
        controller.abort(); // the connection drops mid-answer
        break;
      }
    }
  } catch (e) {
    if (!(e instanceof OpenAI.APIUserAbortError)) throw e;
  }
  const { data, response } = await client.chat.completions.create(params, { headers }).withResponse();
  let content = '';
  let chunks = 0;
  for await (const chunk of data) {
    chunks++;
    content += chunk.choices[0]?.delta?.content ?? '';
  }
  console.log(JSON.stringify({
    firstChunks, chunks, content,
    replayed: response.headers.get('idempotent-replayed'),
  }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
