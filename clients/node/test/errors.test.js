'use strict';
// SluiceError decoding of the grpc-status-details-bin trailer, from bytes encoded with the same schema.

const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { SluiceError, toSluiceError, root, Status } = require('../errors');

function pack(typeName, fields) {
  const type = root.lookupType(typeName);
  return { type_url: `type.googleapis.com/${typeName}`, value: type.encode(type.fromObject(fields)).finish() };
}

test('ErrorInfo, RetryInfo and BadRequest are decoded from the trailer', () => {
  const status = Status.encode(
    Status.fromObject({
      code: grpc.status.RESOURCE_EXHAUSTED,
      message: 'queue is full',
      details: [
        pack('google.rpc.ErrorInfo', { reason: 'QUEUE_FULL', domain: 'sluice.dev', metadata: { model: 'm' } }),
        pack('google.rpc.RetryInfo', { retry_delay: { seconds: 1, nanos: 500000000 } }),
        pack('google.rpc.BadRequest', { field_violations: [{ field: 'inputs', description: 'too big' }] }),
      ],
    }),
  ).finish();
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', Buffer.from(status));
  const raw = Object.assign(new Error('8 RESOURCE_EXHAUSTED'), {
    code: grpc.status.RESOURCE_EXHAUSTED,
    details: 'queue is full',
    metadata,
  });
  const error = toSluiceError(raw);
  assert.ok(error instanceof SluiceError);
  assert.equal(error.codeName, 'RESOURCE_EXHAUSTED');
  assert.equal(error.message, 'RESOURCE_EXHAUSTED/QUEUE_FULL: queue is full');
  assert.deepEqual(
    [error.reason, error.domain, error.metadata, error.retryAfter],
    ['QUEUE_FULL', 'sluice.dev', { model: 'm' }, 1.5],
  );
  assert.deepEqual(error.fieldViolations, [['inputs', 'too big']]);
  assert.equal(error.cause, raw);
});

test('an error without details keeps its code and message', () => {
  const error = toSluiceError(Object.assign(new Error('x'), { code: grpc.status.NOT_FOUND, details: 'no model' }));
  assert.deepEqual([error.codeName, error.grpcMessage, error.reason], ['NOT_FOUND', 'no model', null]);
});
