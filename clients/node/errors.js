'use strict';
// SluiceError: a failed call's gRPC code plus the google.rpc details (ErrorInfo, RetryInfo, BadRequest)
// decoded from the `grpc-status-details-bin` trailer, mirroring the Python client's clients/errors.py.

const grpc = require('@grpc/grpc-js');
const protobuf = require('protobufjs');

// Just the google.rpc messages the server sends, so the client needs no googleapis checkout.
const root = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
            Duration: { fields: { seconds: { type: 'int64', id: 1 }, nanos: { type: 'int32', id: 2 } } },
          },
        },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: 'string', id: 1 },
                domain: { type: 'string', id: 2 },
                metadata: { keyType: 'string', type: 'string', id: 3 },
              },
            },
            RetryInfo: { fields: { retry_delay: { type: 'google.protobuf.Duration', id: 1 } } },
            BadRequest: {
              fields: { field_violations: { rule: 'repeated', type: 'FieldViolation', id: 1 } },
              nested: {
                FieldViolation: {
                  fields: { field: { type: 'string', id: 1 }, description: { type: 'string', id: 2 } },
                },
              },
            },
          },
        },
      },
    },
  },
});
const Status = root.lookupType('google.rpc.Status');
const DETAIL_TYPES = ['ErrorInfo', 'RetryInfo', 'BadRequest'].map((name) => root.lookupType(`google.rpc.${name}`));
const TO_OBJECT = { longs: Number, defaults: true };

const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

class SluiceError extends Error {
  constructor(code, message, details = {}) {
    super(`${CODE_NAMES[code] ?? code}${details.reason ? `/${details.reason}` : ''}: ${message}`);
    this.name = 'SluiceError';
    this.code = code;
    this.codeName = CODE_NAMES[code] ?? 'UNKNOWN';
    this.grpcMessage = message;
    this.reason = details.reason ?? null;
    this.domain = details.domain ?? null;
    this.metadata = details.metadata ?? {};
    this.retryAfter = details.retryAfter ?? null;
    this.fieldViolations = details.fieldViolations ?? [];
  }
}

// Unpack the google.rpc.Status trailer bytes into the details SluiceError carries.
function decodeStatusDetails(bytes) {
  const status = Status.decode(bytes);
  const details = {};
  for (const any of status.details) {
    const type = DETAIL_TYPES.find((t) => any.type_url.endsWith(`/${t.fullName.slice(1)}`));
    if (type === undefined) continue;
    const detail = type.toObject(type.decode(any.value), TO_OBJECT);
    if (type.name === 'ErrorInfo') {
      Object.assign(details, { reason: detail.reason || null, domain: detail.domain || null, metadata: detail.metadata });
    } else if (type.name === 'RetryInfo' && detail.retry_delay) {
      details.retryAfter = detail.retry_delay.seconds + detail.retry_delay.nanos / 1e9;
    } else if (type.name === 'BadRequest') {
      details.fieldViolations = detail.field_violations.map((v) => [v.field, v.description]);
    }
  }
  return details;
}

// Map a grpc-js ServiceError (code, details, metadata) to a SluiceError, keeping it as `cause`.
function toSluiceError(err) {
  if (err instanceof SluiceError || typeof err?.code !== 'number') return err;
  const [bytes] = err.metadata?.get('grpc-status-details-bin') ?? [];
  let details = {};
  if (bytes) {
    try {
      details = decodeStatusDetails(bytes);
    } catch {
      // Undecodable details must not hide the status itself.
    }
  }
  const error = new SluiceError(err.code, err.details ?? err.message, details);
  error.cause = err;
  return error;
}

module.exports = { SluiceError, decodeStatusDetails, toSluiceError, Status, root };
