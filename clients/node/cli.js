#!/usr/bin/env node
'use strict';
// Command line for the Node client; prints JSON lines on stdout so that tests can parse its output.
//
//   node cli.js --target HOST:PORT models
//   node cli.js --target HOST:PORT infer MODEL --fill N --size 512 [--input NAME]
//   node cli.js --target HOST:PORT generate MODEL "prompt" --max-tokens N [--seed S] [--temperature T]
//
// Errors print one JSON line {"error": {...}} on stderr and exit 1; usage errors exit 2.

const { parseArgs } = require('node:util');
const { createClient, tlsCredentials, SluiceError } = require('./index');

const USAGE = `usage: node cli.js --target HOST:PORT <command>
  models                                   one line per loaded model
  infer MODEL --fill N --size K [--input NAME]
                                           one line: the outputs of a [K] tensor filled with N
  generate MODEL PROMPT [--max-tokens N] [--seed S] [--temperature T] [--top-p P] [--top-k K] [--stop S]
                   [--min-tokens N] [--ignore-eos]
                                           one line per chunk; the last has finish_reason and usage
common options: --timeout SECONDS, --priority low|normal|high, --request-id ID,
  --ca FILE (TLS), --cert FILE --key FILE (mTLS)`;

const OPTIONS = {
  target: { type: 'string' },
  ca: { type: 'string' },
  cert: { type: 'string' },
  key: { type: 'string' },
  timeout: { type: 'string' },
  priority: { type: 'string' },
  'request-id': { type: 'string' },
  fill: { type: 'string', default: '0' },
  size: { type: 'string', default: '1' },
  input: { type: 'string' },
  'max-tokens': { type: 'string' },
  seed: { type: 'string' },
  temperature: { type: 'string' },
  'top-p': { type: 'string' },
  'top-k': { type: 'string' },
  stop: { type: 'string', multiple: true },
  'min-tokens': { type: 'string' },
  'ignore-eos': { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
};

class UsageError extends Error {}

const print = (obj) => process.stdout.write(`${JSON.stringify(obj, jsonValue)}\n`);

// Typed arrays print as plain arrays; int64 values as numbers when exact, else as strings.
function jsonValue(_key, value) {
  if (typeof value === 'bigint') return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (ArrayBuffer.isView(value)) return Array.from(value, (v) => jsonValue('', v));
  return value;
}

function number(values, name, parse = Number) {
  if (values[name] === undefined) return undefined;
  const parsed = parse(values[name]);
  if (Number.isNaN(parsed)) throw new UsageError(`--${name} must be a number, got ${values[name]}`);
  return parsed;
}

const modelLine = (m) => ({
  name: m.name,
  version: m.version,
  kind: m.kind,
  description: m.description,
  inputs: m.inputs,
  outputs: m.outputs,
  max_batch_size: m.maxBatchSize,
  context_length: m.contextLength,
  max_tokens: m.maxTokens,
  max_concurrent_sequences: m.maxConcurrentSequences,
  device: m.device,
});

const chunkLine = (c) => ({
  text: c.text,
  token_ids: c.tokenIds,
  finish_reason: c.finishReason,
  usage: c.usage && {
    prompt_tokens: c.usage.promptTokens,
    completion_tokens: c.usage.completionTokens,
    total_tokens: c.usage.totalTokens,
  },
  error: c.error,
});

async function infer(client, [model], values, common) {
  if (!model) throw new UsageError('infer needs a MODEL');
  const size = number(values, 'size', (v) => Number.parseInt(v, 10));
  const fill = number(values, 'fill');
  let name = values.input;
  let dtype = 'float32';
  if (name === undefined) {
    // The model's metadata names its input, so the caller need not know it.
    const [spec] = (await client.getModel(model, common)).inputs;
    if (spec === undefined) throw new UsageError(`model ${model} lists no inputs; pass --input NAME`);
    ({ name, dtype } = spec);
  }
  const data = new Array(size).fill(fill);
  const result = await client.infer(model, { [name]: { data, dtype, shape: [size] } }, common);
  print({
    model: result.model,
    model_version: result.modelVersion,
    request_id: result.requestId,
    outputs: Object.fromEntries(
      Object.entries(result.outputs).map(([key, t]) => [key, { dtype: t.dtype, shape: t.shape, data: t.data }]),
    ),
    queue_wait_s: result.queueWaitS,
    compute_s: result.computeS,
    batch_size: result.batchSize,
  });
}

async function generate(client, [model, prompt], values, common) {
  if (!model || prompt === undefined) throw new UsageError('generate needs a MODEL and a PROMPT');
  const stream = client.generate(model, prompt, {
    ...common,
    maxTokens: number(values, 'max-tokens', (v) => Number.parseInt(v, 10)),
    seed: values.seed,
    temperature: number(values, 'temperature'),
    topP: number(values, 'top-p'),
    topK: number(values, 'top-k', (v) => Number.parseInt(v, 10)),
    stop: values.stop,
    minTokens: number(values, 'min-tokens', (v) => Number.parseInt(v, 10)),
    ignoreEos: values['ignore-eos'] ?? false,
  });
  // Ctrl-C cancels the call, so the server frees the sequence at once.
  const onSigint = () => stream.cancel();
  process.once('SIGINT', onSigint);
  try {
    for await (const chunk of stream) print(chunkLine(chunk));
  } finally {
    process.removeListener('SIGINT', onSigint);
  }
}

async function main(argv) {
  const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const [command, ...rest] = positionals;
  if (!values.target) throw new UsageError('--target HOST:PORT is required');
  const timeout = number(values, 'timeout');
  const { ca, cert, key } = values;
  const tls = ca || cert ? tlsCredentials({ ca, cert, key }) : undefined;
  const client = createClient(values.target, {
    timeoutMs: timeout === undefined ? 30_000 : timeout * 1000,
    credentials: tls,
  });
  const common = { priority: values.priority, requestId: values['request-id'] };
  try {
    if (command === 'models') (await client.listModels()).forEach((m) => print(modelLine(m)));
    else if (command === 'infer') await infer(client, rest, values, common);
    else if (command === 'generate') await generate(client, rest, values, common);
    else throw new UsageError(`unknown command ${command ?? '(none)'}`);
  } finally {
    client.close();
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    if (err instanceof UsageError || err?.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
      process.stderr.write(`${err.message}\n${USAGE}\n`);
      process.exitCode = 2;
      return;
    }
    const error =
      err instanceof SluiceError
        ? {
            code: err.code,
            code_name: err.codeName,
            message: err.grpcMessage,
            reason: err.reason,
            domain: err.domain,
            metadata: err.metadata,
            retry_after: err.retryAfter,
            field_violations: err.fieldViolations,
          }
        : { code: null, code_name: 'CLIENT', message: String(err?.message ?? err) };
    process.stderr.write(`${JSON.stringify({ error })}\n`);
    process.exitCode = 1;
  },
);
