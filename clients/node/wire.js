'use strict';
// The wire contract beyond the protos, as the Python side's `wire` package states it (wire/metadata.py,
// wire/errors.py): metadata keys, trailers, service names, error domains. tests/unit/clients/test_node_wire.py
// checks every value here against those modules.

module.exports = Object.freeze({
  AUTHORIZATION: 'authorization',
  REQUEST_ID: 'x-request-id',
  USER: 'x-sluice-user',
  TENANT: 'x-sluice-tenant',
  RETRY_PUSHBACK_MS: 'grpc-retry-pushback-ms',
  INFERENCE_SERVICE: 'sluice.inference.v1.InferenceService',
  READINESS_SERVICE: 'sluice.readiness',
  DOMAIN: 'sluice.inference.v1',
  SHIM_DOMAIN: 'shim.sluice',
});
