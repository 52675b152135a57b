#!/usr/bin/env node
'use strict';
// A KServe v2 (Open Inference Protocol) example over @grpc/grpc-js: the protocol's own proto, loaded at
// run time, against Sluice's `inference.GRPCInferenceService`. Prints one JSON line per step.
//
//   node kserve.js --target 127.0.0.1:50051 [--fill 0.5] [--prompt Hello] [--max-tokens 8]

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.resolve(__dirname, '..', '..', 'protos', 'sluice', 'kserve', 'v2', 'grpc_service.proto');

function options(argv) {
  const out = { target: '127.0.0.1:50051', fill: 0.5, prompt: 'Hello', maxTokens: 8 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === '--target') out.target = value;
    else if (flag === '--fill') out.fill = Number(value);
    else if (flag === '--prompt') out.prompt = value;
    else if (flag === '--max-tokens') out.maxTokens = Number(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  return out;
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 30_000 }, (error, answer) => (error ? reject(error) : resolve(answer)));
  });
}

// BYTES elements travel raw as a 4-byte little-endian length and the bytes.
function bytesElement(text) {
  const body = Buffer.from(text, 'utf8');
  const length = Buffer.alloc(4);
  length.writeUInt32LE(body.length);
  return Buffer.concat([length, body]);
}

async function main() {
  const args = options(process.argv.slice(2));
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: Number, defaults: true, oneofs: true });
  const { inference } = grpc.loadPackageDefinition(definition);
  const client = new inference.GRPCInferenceService(args.target, grpc.credentials.createInsecure());
  const live = await unary(client, 'ServerLive', {});
  console.log(JSON.stringify({ step: 'live', live: live.live }));
  const meta = await unary(client, 'ModelMetadata', { name: 'mlp' });
  console.log(JSON.stringify({ step: 'metadata', inputs: meta.inputs }));

  const x = new Float32Array(512).fill(args.fill);
  const answer = await unary(client, 'ModelInfer', {
    model_name: 'mlp',
    id: 'node-1',
    inputs: [{ name: 'x', datatype: 'FP32', shape: [1, 512] }],
    raw_input_contents: [Buffer.from(x.buffer)],
  });
  const raw = answer.raw_output_contents[0];
  const y = Array.from(new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4));
  console.log(JSON.stringify({ step: 'infer', id: answer.id, shape: answer.outputs[0].shape, y }));

  const stream = client.ModelStreamInfer();
  const pieces = [];
  await new Promise((resolve, reject) => {
    stream.on('data', (message) => {
      if (message.error_message) {
        reject(new Error(message.error_message));
        return;
      }
      const response = message.infer_response;
      const bytes = response.raw_output_contents[0];
      pieces.push(bytes.subarray(4).toString('utf8'));
      const final = response.parameters.triton_final_response;
      if (final && final.bool_param) {
        stream.end();
        resolve();
      }
    });
    stream.on('error', reject);
    stream.write({
      model_name: 'byte-lm',
      inputs: [{ name: 'text_input', datatype: 'BYTES', shape: [1] }],
      raw_input_contents: [bytesElement(args.prompt)],
      parameters: {
        max_tokens: { int64_param: args.maxTokens },
        temperature: { double_param: 0 },
        triton_enable_empty_final_response: { bool_param: true },
      },
    });
  });
  console.log(JSON.stringify({ step: 'stream', pieces }));
  client.close();
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
