'use strict';
// Structured outputs and tool calls through the shim with the official `openai` npm package: prints, as one
// JSON line, the contents of N json_schema answers (seeds 0..N-1), a required tool call, and the tool-call
// deltas of the same call streamed, for the Python side to validate.
// Usage: NODE_PATH=clients/node/node_modules node openai_structured.js BASE_URL MODEL N

const { OpenAI } = require('openai');

const SCHEMA = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 6 }, ok: { type: 'boolean' } },
  required: ['name', 'ok'],
  additionalProperties: false,
};
const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] },
  },
}];

async function main() {
  const [baseURL, model, count] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey: 'unused' });
  const messages = [{ role: 'user', content: 'Describe someone' }];
  const format = { type: 'json_schema', json_schema: { name: 'person', schema: SCHEMA, strict: true } };
  const answers = await Promise.all(Array.from({ length: Number(count) }, (_, seed) =>
    client.chat.completions.create({ model, messages, seed, max_tokens: 100, response_format: format })));
  const ask = { model, messages, tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false, seed: 4,
    max_tokens: 150 };
  const whole = await client.chat.completions.create(ask);
  const deltas = [];
  for await (const chunk of await client.chat.completions.create({ ...ask, stream: true })) {
    for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) deltas.push(call);
  }
  process.stdout.write(`${JSON.stringify({
    contents: answers.map((a) => a.choices[0].message.content),
    call: whole.choices[0].message.tool_calls,
    finish: whole.choices[0].finish_reason,
    deltas,
  })}\n`);
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
