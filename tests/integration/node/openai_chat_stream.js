'use strict';
// Streams one chat completion through the shim with the official `openai` npm package and prints, as one
// JSON line, the streamed text, the non-streamed text for the same seed, and the chunk count.
// Usage: NODE_PATH=clients/node/node_modules node openai_chat_stream.js BASE_URL MODEL

const { OpenAI } = require('openai');

async function main() {
  const [baseURL, model] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey: 'unused' });
  const messages = [{ role: 'user', content: 'Tell me a story' }];
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 20, seed: 9, stream: true });
  let streamed = '';
  let chunks = 0;
  let role = null;
  for await (const chunk of stream) {
    chunks += 1;
    const delta = chunk.choices[0]?.delta ?? {};
    role = role ?? delta.role ?? null;
    streamed += delta.content ?? '';
  }
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 20, seed: 9 });
  process.stdout.write(`${JSON.stringify({ streamed, whole: whole.choices[0].message.content, chunks, role })}\n`);
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
