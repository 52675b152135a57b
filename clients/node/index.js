'use strict';
// The Sluice Node.js client: createClient(target) -> { infer, generate, listModels, getModel, close }.
// The proto is loaded at run time from the repository's protos/ folder, so there is no generated code.

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { decodeTensor, encodeParameters, encodePriority, encodeTensor } = require('./tensor');
const { SluiceError, toSluiceError } = require('./errors');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const PROTO_FILE = 'sluice/inference/v1/inference.proto';
const { INFERENCE_SERVICE: SERVICE } = require('./wire');

// Same policy as the Python client (AIP-194): retry only UNAVAILABLE, only the unary calls, never Generate.
const SERVICE_CONFIG = {
  methodConfig: [
    {
      name: ['Infer', 'ListModels', 'GetModel'].map((method) => ({ service: SERVICE, method })),
      retryPolicy: {
        maxAttempts: 4,
        initialBackoff: '0.1s',
        maxBackoff: '2s',
        backoffMultiplier: 2,
        retryableStatusCodes: ['UNAVAILABLE'],
      },
    },
  ],
};
const CHANNEL_OPTIONS = {
  'grpc.max_send_message_length': 64 * 1024 * 1024,
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
  'grpc.keepalive_time_ms': 30_000,
  'grpc.keepalive_timeout_ms': 10_000,
  'grpc.enable_retries': 1,
  'grpc.service_config': JSON.stringify(SERVICE_CONFIG),
};

let serviceCtor;
let samplingFields;
function loadService() {
  if (serviceCtor === undefined) {
    // keepCase keeps the proto's snake_case names; defaults fills unset scalars so decoding needs no guards.
    const definition = protoLoader.loadSync(PROTO_FILE, {
      includeDirs: [PROTO_ROOT],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    serviceCtor = grpc.loadPackageDefinition(definition).sluice.inference.v1.InferenceService;
    samplingFields = definition['sluice.inference.v1.SamplingParams'].type.field;
  }
  return serviceCtor;
}

const FINISH_REASONS = {
  FINISH_REASON_LENGTH: 'length',
  FINISH_REASON_STOP: 'stop',
  FINISH_REASON_CANCELLED: 'cancelled',
  FINISH_REASON_ERROR: 'error',
  FINISH_REASON_TOOL_CALLS: 'tool_calls',
};
const MODEL_KINDS = { MODEL_KIND_TENSOR: 'tensor', MODEL_KIND_GENERATIVE: 'generative' };
const seconds = (d) => (d ? Number(d.seconds) + d.nanos / 1e9 : 0);

function decodeChunk(msg) {
  return {
    text: msg.text,
    tokenIds: msg.token_ids.map(Number),
    finishReason: FINISH_REASONS[msg.finish_reason] ?? null,
    usage: msg.usage
      ? {
          promptTokens: msg.usage.prompt_tokens,
          completionTokens: msg.usage.completion_tokens,
          totalTokens: msg.usage.total_tokens,
          cachedTokens: msg.usage.cached_tokens ?? 0,
        }
      : null,
    error: msg.error ? { code: msg.error.code, message: msg.error.message, reason: msg.error.reason || null } : null,
    toolCalls: (msg.tool_calls ?? []).map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
  };
}

// What the output must be (the proto's Constraint): { jsonSchema: object | string, lenient? } |
// { jsonObject: true } | { regex } | { choice: [strings] } | { grammar, syntax: 'lark' | 'gbnf' }.
function buildConstraint(c) {
  if (c.jsonSchema !== undefined) {
    const schema = typeof c.jsonSchema === 'string' ? c.jsonSchema : JSON.stringify(c.jsonSchema);
    return { json_schema: schema, lenient: Boolean(c.lenient) };
  }
  if (c.jsonObject) return { json_object: {} };
  if (c.regex !== undefined) return { regex: c.regex };
  if (c.choice !== undefined) return { choice: { options: c.choice } };
  if (c.grammar !== undefined) {
    return { grammar: { text: c.grammar, syntax: c.syntax === 'gbnf' ? 'GRAMMAR_SYNTAX_GBNF' : 'GRAMMAR_SYNTAX_LARK' } };
  }
  throw new TypeError('a constraint is one of jsonSchema, jsonObject, regex, choice or grammar');
}

const TOOL_MODES = { none: 'TOOL_CHOICE_MODE_NONE', auto: 'TOOL_CHOICE_MODE_AUTO', required: 'TOOL_CHOICE_MODE_REQUIRED' };

function buildTools(request, opts) {
  if (opts.constraint) request.constraint = buildConstraint(opts.constraint);
  if (opts.tools) {
    request.tools = opts.tools.map((t) => ({
      name: t.name,
      description: t.description ?? '',
      parameters_json: t.parameters ? JSON.stringify(t.parameters) : '',
      strict: Boolean(t.strict),
    }));
  }
  if (opts.toolChoice) {
    request.tool_choice = typeof opts.toolChoice === 'string'
      ? { mode: TOOL_MODES[opts.toolChoice] }
      : { function: opts.toolChoice.function };
  }
  if (opts.parallelToolCalls !== undefined) request.parallel_tool_calls = opts.parallelToolCalls;
}

function chatMessage(m) {
  return {
    role: m.role,
    content: m.content ?? '',
    tool_calls: (m.toolCalls ?? []).map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
    tool_call_id: m.toolCallId ?? '',
    name: m.name ?? '',
  };
}

function decodeSpec(spec) {
  return { name: spec.name, dtype: spec.dtype.replace('DATA_TYPE_', '').toLowerCase(), shape: spec.shape.map(Number) };
}

function decodeModel(info) {
  const limits = info.limits ?? {};
  return {
    name: info.name,
    version: info.version,
    kind: MODEL_KINDS[info.kind] ?? 'unspecified',
    description: info.description,
    inputs: info.inputs.map(decodeSpec),
    outputs: info.outputs.map(decodeSpec),
    maxBatchSize: limits.max_batch_size ?? 0,
    contextLength: limits.context_length ?? 0,
    maxTokens: limits.max_tokens ?? 0,
    maxConcurrentSequences: limits.max_concurrent_sequences ?? 0,
    device: info.device,
  };
}

// Every field of the proto's SamplingParams, by name: the option `maxTokens` sets `max_tokens`, so a new
// sampling field needs nothing here. Only given options are set: unset proto3 optionals let the server
// apply its defaults.
function buildSampling(opts) {
  loadService();
  const sampling = { stop: [] };
  for (const field of samplingFields) {
    const value = opts[field.name.replace(/_([a-z])/g, (_, c) => c.toUpperCase())];
    if (value === undefined || value === null || value === false) continue;
    if (field.label === 'LABEL_REPEATED') sampling[field.name] = typeof value === 'string' ? [value] : value;
    else if (field.type === 'TYPE_UINT64') sampling[field.name] = String(value); // a string keeps every digit
    else sampling[field.name] = value;
  }
  return sampling;
}

/**
 * TLS channel credentials: `ca` the PEM file the server's certificate chains to (omitted: the system's
 * roots); `cert` and `key` this client's own certificate and key, for a server that requires one (mTLS).
 */
function tlsCredentials({ ca, cert, key } = {}) {
  if ((cert === undefined) !== (key === undefined)) throw new TypeError('cert and key go together');
  const read = (file) => (file === undefined ? null : fs.readFileSync(file));
  return grpc.credentials.createSsl(read(ca), read(key), read(cert));
}

/**
 * Create a client for the server at `target` ("host:port").
 * Options: timeoutMs (default deadline of every call, 30000; null for none), credentials (grpc-js channel
 * credentials; insecure by default).
 */
function createClient(target, { timeoutMs = 30_000, credentials } = {}) {
  const Service = loadService();
  const stub = new Service(target, credentials ?? grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const callOptions = (opts) => {
    const ms = opts.timeoutMs !== undefined ? opts.timeoutMs : timeoutMs;
    return ms === null ? {} : { deadline: new Date(Date.now() + ms) };
  };
  const unary = (method, request, opts) =>
    new Promise((resolve, reject) => {
      stub[method](request, new grpc.Metadata(), callOptions(opts), (err, response) =>
        err ? reject(toSluiceError(err)) : resolve(response),
      );
    });

  return {
    /** Run one item through a tensor model. `inputs`: { name: Float32Array | string[] | { data, shape, dtype } }. */
    async infer(model, inputs, opts = {}) {
      const request = {
        model,
        inputs: Object.entries(inputs).map(([name, value]) => encodeTensor(name, value)),
        parameters: encodeParameters(opts.parameters),
        priority: encodePriority(opts.priority),
        request_id: opts.requestId ?? '',
      };
      const response = await unary('Infer', request, opts);
      const outputs = Object.fromEntries(response.outputs.map((t) => [t.name, decodeTensor(t)]));
      return {
        model: response.model,
        modelVersion: response.model_version,
        outputs,
        queueWaitS: seconds(response.timings?.queue_wait),
        computeS: seconds(response.timings?.compute),
        batchSize: response.timings?.batch_size ?? 0,
        requestId: response.request_id,
      };
    },

    /**
     * Start a generation. Returns an async iterable of chunks with cancel(); iteration after cancel() ends
     * quietly, other failures throw SluiceError. Leaving a for-await loop early cancels the call.
     * `prompt`: text, token ids, or chat messages ({ role, content, toolCalls, toolCallId, name }).
     * Options: every SamplingParams field in camelCase (maxTokens, temperature, topP, topK, seed, stop,
     * minTokens, ignoreEos, presencePenalty, frequencyPenalty, repetitionPenalty, logitBias, stopTokenIds),
     * constraint, tools ({ name, description, parameters, strict }), toolChoice ('none' | 'auto' | 'required' |
     * { function }), parallelToolCalls, priority, requestId, timeoutMs.
     */
    generate(model, prompt, opts = {}) {
      const request = {
        model,
        sampling: buildSampling(opts),
        priority: encodePriority(opts.priority),
        request_id: opts.requestId ?? '',
      };
      buildTools(request, opts);
      if (typeof prompt === 'string') request.text = prompt;
      else if (prompt.length && typeof prompt[0] === 'object') request.chat = { messages: prompt.map(chatMessage) };
      else request.token_ids = { ids: Array.from(prompt, Number) };
      const call = stub.Generate(request, new grpc.Metadata(), callOptions(opts));
      let cancelled = false;
      let finished = false;
      const cancel = () => {
        cancelled = true;
        call.cancel();
      };
      async function* chunks() {
        try {
          for await (const msg of call) yield decodeChunk(msg);
          finished = true;
        } catch (err) {
          finished = true;
          if (cancelled && err.code === grpc.status.CANCELLED) return;
          throw toSluiceError(err);
        } finally {
          if (!finished) cancel();
        }
      }
      const iterator = chunks();
      return { [Symbol.asyncIterator]: () => iterator, cancel };
    },

    /** Every loaded model, sorted by name. */
    async listModels(opts = {}) {
      const response = await unary('ListModels', {}, opts);
      return response.models.map(decodeModel);
    },

    /** One model's metadata; rejects with SluiceError (codeName NOT_FOUND) for an unknown name. */
    async getModel(name, opts = {}) {
      const response = await unary('GetModel', { name }, opts);
      return decodeModel(response.model);
    },

    close() {
      stub.close();
    },
  };
}

module.exports = { createClient, tlsCredentials, SluiceError, SERVICE_CONFIG };
