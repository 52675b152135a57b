'use strict';
// Tensor encoding: JS typed arrays and string arrays <-> sluice.inference.v1.Tensor plain objects.
// Numeric data travels as little-endian bytes in raw_contents; strings as contents.string_contents.
// Pure functions with no gRPC import, so they are unit-tested without a server.

const os = require('node:os');

// dtype name -> wire enum name, element size, the typed array that holds it, and its DataView accessors.
const DTYPES = {
  float32: { wire: 'DATA_TYPE_FLOAT32', size: 4, Array: Float32Array, get: 'getFloat32', set: 'setFloat32' },
  float64: { wire: 'DATA_TYPE_FLOAT64', size: 8, Array: Float64Array, get: 'getFloat64', set: 'setFloat64' },
  // Node 20 has no Float16Array: half floats are carried as their uint16 bit patterns and decoded to float32.
  float16: { wire: 'DATA_TYPE_FLOAT16', size: 2, Array: Uint16Array, get: 'getUint16', set: 'setUint16' },
  int32: { wire: 'DATA_TYPE_INT32', size: 4, Array: Int32Array, get: 'getInt32', set: 'setInt32' },
  int64: { wire: 'DATA_TYPE_INT64', size: 8, Array: BigInt64Array, get: 'getBigInt64', set: 'setBigInt64' },
  bool: { wire: 'DATA_TYPE_BOOL', size: 1, Array: Uint8Array, get: 'getUint8', set: 'setUint8' },
};
const DTYPE_BY_WIRE = Object.fromEntries(Object.entries(DTYPES).map(([name, d]) => [d.wire, name]));
DTYPE_BY_WIRE.DATA_TYPE_STRING = 'string';

const PRIORITIES = { low: 'PRIORITY_LOW', normal: 'PRIORITY_NORMAL', high: 'PRIORITY_HIGH' };

// Typed arrays whose dtype follows from their class; Uint8Array and Uint16Array are ambiguous and need `dtype`.
function inferDtype(data) {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof Float64Array) return 'float64';
  if (data instanceof Int32Array) return 'int32';
  if (data instanceof BigInt64Array) return 'int64';
  return undefined;
}

function toLittleEndianBytes(typed, dtype, hostIsLittleEndian = os.endianness() === 'LE') {
  const spec = DTYPES[dtype];
  if (hostIsLittleEndian || spec.size === 1) {
    // Zero-copy view: the host order already is the wire order.
    return Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength);
  }
  const out = Buffer.alloc(typed.length * spec.size);
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let i = 0; i < typed.length; i += 1) view[spec.set](i * spec.size, typed[i], true);
  return out;
}

function coerceData(name, data, dtype) {
  const spec = DTYPES[dtype];
  if (data instanceof spec.Array) return data;
  if (dtype === 'bool') return Uint8Array.from(data, (v) => (v ? 1 : 0));
  if (dtype === 'int64') return BigInt64Array.from(data, (v) => BigInt(v));
  if (dtype === 'float16') return Uint16Array.from(data, floatToHalf);
  if (ArrayBuffer.isView(data) || Array.isArray(data)) return spec.Array.from(data);
  throw new TypeError(`input ${name}: data must be a typed array or an array`);
}

/**
 * Encode one input as a Tensor plain object.
 * `value` is a typed array (shape defaults to [length]), an array of strings, or
 * `{ data, shape?, dtype? }` where dtype is one of float32, float64, float16, int32, int64, bool, string.
 */
function encodeTensor(name, value) {
  const spec = ArrayBuffer.isView(value) || Array.isArray(value) ? { data: value } : value;
  if (spec === null || typeof spec !== 'object' || spec.data === undefined) {
    throw new TypeError(`input ${name}: expected a typed array, a string array or { data, shape, dtype }`);
  }
  const isStrings = Array.isArray(spec.data) && spec.data.length > 0 && spec.data.every((v) => typeof v === 'string');
  const dtype = spec.dtype ?? (isStrings ? 'string' : inferDtype(spec.data));
  if (dtype === undefined) {
    throw new TypeError(`input ${name}: cannot infer the dtype of ${spec.data.constructor.name}; pass { data, dtype }`);
  }
  const length = spec.data.length;
  const shape = (spec.shape ?? [length]).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  if (count !== length) {
    throw new RangeError(`input ${name}: shape [${shape}] holds ${count} elements, data has ${length}`);
  }
  if (dtype === 'string') {
    return { name, dtype: 'DATA_TYPE_STRING', shape, contents: { string_contents: spec.data.map(String) } };
  }
  if (!(dtype in DTYPES)) throw new RangeError(`input ${name}: unsupported dtype ${dtype}`);
  const typed = coerceData(name, spec.data, dtype);
  return { name, dtype: DTYPES[dtype].wire, shape, raw_contents: toLittleEndianBytes(typed, dtype) };
}

function fromLittleEndianBytes(buf, dtype, count, hostIsLittleEndian = os.endianness() === 'LE') {
  const spec = DTYPES[dtype];
  if (hostIsLittleEndian && buf.byteOffset % spec.size === 0) {
    // Zero-copy view over the received buffer; only possible when its offset is aligned for the type.
    return new spec.Array(buf.buffer, buf.byteOffset, count);
  }
  const out = new spec.Array(count);
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  for (let i = 0; i < count; i += 1) out[i] = view[spec.get](i * spec.size, true);
  return out;
}

function typedContents(contents, dtype) {
  const c = contents ?? {};
  switch (dtype) {
    case 'float32':
    case 'float16': // half floats arrive as fp32_contents
      return Float32Array.from(c.fp32_contents ?? []);
    case 'float64':
      return Float64Array.from(c.fp64_contents ?? []);
    case 'int32':
      return Int32Array.from(c.int32_contents ?? []);
    case 'int64':
      return BigInt64Array.from(c.int64_contents ?? [], (v) => BigInt(v));
    default:
      return Uint8Array.from(c.bool_contents ?? [], (v) => (v ? 1 : 0));
  }
}

/**
 * Decode a Tensor plain object to `{ name, dtype, shape, data }`: data is a Float32Array, Float64Array,
 * Int32Array, BigInt64Array, Uint8Array (bool, 0/1) or string[]; float16 is widened to Float32Array.
 */
function decodeTensor(tensor) {
  const dtype = DTYPE_BY_WIRE[tensor.dtype];
  if (dtype === undefined) throw new RangeError(`output ${tensor.name}: unsupported dtype ${tensor.dtype}`);
  const shape = (tensor.shape ?? []).map(Number);
  if (dtype === 'string') {
    return { name: tensor.name, dtype, shape, data: [...(tensor.contents?.string_contents ?? [])] };
  }
  const count = shape.reduce((a, b) => a * b, 1);
  const raw = tensor.raw_contents;
  let data;
  if (raw && raw.length > 0) {
    if (raw.length !== count * DTYPES[dtype].size) {
      throw new RangeError(`output ${tensor.name}: ${raw.length} raw bytes do not fill shape [${shape}] of ${dtype}`);
    }
    data = fromLittleEndianBytes(raw, dtype, count);
    if (dtype === 'float16') data = Float32Array.from(data, halfToFloat);
  } else {
    data = typedContents(tensor.contents, dtype);
    if (data.length !== count) {
      throw new RangeError(`output ${tensor.name}: ${data.length} elements do not fill shape [${shape}]`);
    }
  }
  return { name: tensor.name, dtype, shape, data };
}

function halfToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

function floatToHalf(value) {
  // Round-to-nearest via a float32 view; exact for values representable in half precision.
  const f32 = new Float32Array([value]);
  const bits = new Uint32Array(f32.buffer)[0];
  const sign = (bits >>> 16) & 0x8000;
  const exponent = ((bits >>> 23) & 0xff) - 127 + 15;
  const mantissa = bits & 0x7fffff;
  if (((bits >>> 23) & 0xff) === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0);
  if (exponent >= 0x1f) return sign | 0x7c00;
  if (exponent <= 0) {
    if (exponent < -10) return sign;
    const m = (mantissa | 0x800000) >> (1 - exponent);
    return sign | ((m + 0x1000) >> 13);
  }
  return sign | (exponent << 10) | ((mantissa + 0x1000) >> 13);
}

function encodePriority(priority) {
  if (priority === undefined || priority === null) return 'PRIORITY_UNSPECIFIED';
  const wire = PRIORITIES[priority];
  if (wire === undefined) throw new RangeError(`priority must be low, normal or high, got ${priority}`);
  return wire;
}

const PARAMETER_KINDS = ['bool_value', 'int64_value', 'double_value', 'string_value'];

// Per-request parameters: the ParameterValue oneof is chosen by the JS type. JS cannot tell 2.0 from 2,
// so a whole-number double must be passed explicitly as { double_value: 2 }.
function encodeParameters(parameters = {}) {
  const out = {};
  for (const [key, value] of Object.entries(parameters)) {
    const explicit = value !== null && typeof value === 'object' ? Object.keys(value) : [];
    if (explicit.length === 1 && PARAMETER_KINDS.includes(explicit[0])) out[key] = value;
    else if (typeof value === 'boolean') out[key] = { bool_value: value };
    else if (typeof value === 'bigint') out[key] = { int64_value: value.toString() };
    else if (typeof value === 'number' && Number.isInteger(value)) out[key] = { int64_value: String(value) };
    else if (typeof value === 'number') out[key] = { double_value: value };
    else if (typeof value === 'string') out[key] = { string_value: value };
    else throw new TypeError(`parameter ${key}: expected boolean, number, bigint or string`);
  }
  return out;
}

module.exports = {
  decodeTensor,
  encodeParameters,
  encodePriority,
  encodeTensor,
  floatToHalf,
  fromLittleEndianBytes,
  halfToFloat,
  toLittleEndianBytes,
};
