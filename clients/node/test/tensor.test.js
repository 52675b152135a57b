'use strict';
// Tensor encoding helpers: wire byte order, dtype inference, round trips, typed contents; no server needed.

const test = require('node:test');
const assert = require('node:assert/strict');
const {
  decodeTensor,
  encodeParameters,
  encodePriority,
  encodeTensor,
  floatToHalf,
  fromLittleEndianBytes,
  halfToFloat,
  toLittleEndianBytes,
} = require('../tensor');

test('Float32Array is sent as little-endian raw bytes with shape [length]', () => {
  const tensor = encodeTensor('x', new Float32Array([1, -2]));
  assert.equal(tensor.dtype, 'DATA_TYPE_FLOAT32');
  assert.deepEqual(tensor.shape, [2]);
  assert.deepEqual([...tensor.raw_contents], [0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0]);
  assert.equal(tensor.contents, undefined);
});

test('the big-endian fallback writes the same bytes as the little-endian fast path', () => {
  const values = new Int32Array([1, 256, -1]);
  const fast = toLittleEndianBytes(values, 'int32', true);
  const slow = toLittleEndianBytes(values, 'int32', false);
  assert.deepEqual([...slow], [...fast]);
  assert.deepEqual([...fromLittleEndianBytes(slow, 'int32', 3, false)], [1, 256, -1]);
});

const ROUND_TRIPS = [
  ['float32', new Float32Array([0.5, -1.25, 3, 4, 5, 6])],
  ['float64', new Float64Array([0.1, 0.2, 0.3, 1e300, -5, 6])],
  ['int32', new Int32Array([1, -2, 3, -4, 2147483647, -2147483648])],
  ['int64', new BigInt64Array([1n, -2n, 2n ** 62n, 0n, 5n, -(2n ** 63n)])],
];
for (const [dtype, data] of ROUND_TRIPS) {
  test(`${dtype} round-trips with its shape`, () => {
    const tensor = encodeTensor('x', { data, shape: [2, 3] });
    assert.equal(tensor.dtype, `DATA_TYPE_${dtype.toUpperCase()}`);
    const decoded = decodeTensor({ ...tensor, shape: tensor.shape.map(String) }); // int64 shapes arrive as strings
    assert.equal(decoded.dtype, dtype);
    assert.deepEqual(decoded.shape, [2, 3]);
    assert.equal(decoded.data.constructor, data.constructor);
    assert.deepEqual([...decoded.data], [...data]);
  });
}

test('bool and float16 need an explicit dtype and round-trip', () => {
  const bools = encodeTensor('b', { data: [true, false, true], dtype: 'bool' });
  assert.deepEqual([...bools.raw_contents], [1, 0, 1]);
  assert.deepEqual([...decodeTensor(bools).data], [1, 0, 1]);
  const halves = encodeTensor('h', { data: [1, -2, 0.5, 65504], dtype: 'float16' });
  assert.equal(halves.raw_contents.length, 8);
  assert.deepEqual([...decodeTensor(halves).data], [1, -2, 0.5, 65504]);
});

test('half float conversion handles specials', () => {
  assert.equal(halfToFloat(floatToHalf(Infinity)), Infinity);
  assert.ok(Number.isNaN(halfToFloat(floatToHalf(NaN))));
  assert.equal(halfToFloat(0x0001), 2 ** -24); // smallest subnormal
  assert.equal(halfToFloat(floatToHalf(1e6)), Infinity); // overflow
});

test('a raw buffer at an unaligned offset is copied rather than viewed', () => {
  const backing = Buffer.alloc(9);
  const unaligned = backing.subarray(1);
  new DataView(unaligned.buffer, unaligned.byteOffset).setFloat64(0, 2.5, true);
  const decoded = decodeTensor({ name: 'y', dtype: 'DATA_TYPE_FLOAT64', shape: ['1'], raw_contents: unaligned });
  assert.deepEqual([...decoded.data], [2.5]);
});

test('an aligned raw buffer is decoded without a copy', () => {
  const raw = Buffer.from(new Float32Array([7, 8]).buffer);
  const decoded = decodeTensor({ name: 'y', dtype: 'DATA_TYPE_FLOAT32', shape: ['2'], raw_contents: raw });
  assert.equal(decoded.data.buffer, raw.buffer);
});

test('strings travel as typed contents', () => {
  const tensor = encodeTensor('s', ['héllo', 'world']);
  assert.equal(tensor.dtype, 'DATA_TYPE_STRING');
  assert.equal(tensor.raw_contents, undefined);
  assert.deepEqual(tensor.contents.string_contents, ['héllo', 'world']);
  assert.deepEqual(decodeTensor(tensor).data, ['héllo', 'world']);
});

test('typed contents decode when raw is empty', () => {
  const decoded = decodeTensor({
    name: 'z',
    dtype: 'DATA_TYPE_INT64',
    shape: ['2'],
    raw_contents: Buffer.alloc(0),
    contents: { int64_contents: ['9007199254740993', '-1'] },
  });
  assert.deepEqual([...decoded.data], [9007199254740993n, -1n]);
});

test('mismatched shapes and unknown dtypes are rejected', () => {
  assert.throws(() => encodeTensor('x', { data: new Float32Array(3), shape: [2, 2] }), /holds 4 elements/);
  assert.throws(() => encodeTensor('x', new Uint8Array(2)), /cannot infer the dtype/);
  assert.throws(() => encodeTensor('x', { data: [1], dtype: 'uint8' }), /unsupported dtype/);
  assert.throws(
    () => decodeTensor({ name: 'y', dtype: 'DATA_TYPE_FLOAT32', shape: ['3'], raw_contents: Buffer.alloc(8) }),
    /8 raw bytes/,
  );
});

test('priorities and parameters map to the wire', () => {
  assert.equal(encodePriority(undefined), 'PRIORITY_UNSPECIFIED');
  assert.equal(encodePriority('high'), 'PRIORITY_HIGH');
  assert.throws(() => encodePriority('urgent'), /low, normal or high/);
  assert.deepEqual(encodeParameters({ a: true, b: 3, c: 0.5, d: 's', e: { double_value: 2 } }), {
    a: { bool_value: true },
    b: { int64_value: '3' },
    c: { double_value: 0.5 },
    d: { string_value: 's' },
    e: { double_value: 2 },
  });
});
