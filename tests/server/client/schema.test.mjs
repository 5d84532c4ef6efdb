// JSON schemas with ranges, patterns, formats and enums through the real server: for each schema, 20 sampled
// outputs (temperature 1, a different seed each) from the random-weight tiny model under constrained
// decoding, every one validated by ajv with ajv-formats - an independent validator - both as response_format
// json_schema content and as forced tool-call arguments; keywords the grammar cannot honour are 400s that
// name them.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { startServer } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer({ parallel: 4 });
  client = srv.client({ timeout: 600_000 });  // a loaded CI machine is slow; the test's own limit applies
});
after(async () => { await srv?.stop(); });

const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);
const noThink = { chat_template_kwargs: { enable_thinking: false } };
const SAMPLES = 20;

// Small schemas: the random model on a CPU costs about 15 ms a token, and each sample is a few dozen.
const schemas = {
  ranges: {
    type: 'object',
    properties: {
      small: { type: 'integer', maximum: 5 },
      offset: { type: 'integer', minimum: -40, exclusiveMaximum: -3, multipleOf: 3 },
      price: { type: 'number', minimum: 0.1, exclusiveMaximum: 0.3 },
    },
    required: ['small', 'offset', 'price'],
    additionalProperties: false,
  },
  patterns: {
    type: 'object',
    properties: {
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
      quoted: { type: 'string', pattern: '^["\\\\/\\n a-c]{1,4}$' },
      contains: { type: 'string', pattern: 'ab', maxLength: 5 },
    },
    required: ['code', 'quoted', 'contains'],
    additionalProperties: false,
  },
  formats: {
    type: 'object',
    properties: {
      day: { type: 'string', format: 'date' },
      mail: { type: 'string', format: 'email', maxLength: 10 },
      ip: { type: 'string', format: 'ipv4' },
    },
    required: ['day', 'mail', 'ip'],
    additionalProperties: false,
  },
  'long formats': {
    type: 'object',
    properties: {
      when: { type: 'string', format: 'date-time' },
      at: { type: 'string', format: 'time' },
      id: { type: 'string', format: 'uuid' },
    },
    required: ['when', 'at', 'id'],
    additionalProperties: false,
  },
  enums: {
    type: 'object',
    properties: {
      color: { enum: ['red', 'green', 'blue'] },
      level: { type: 'integer', enum: [1, 2, 3, 40], maximum: 10 },
      shape: { const: { r: [1, 2.5, null] } },
      tags: { type: 'array', items: { enum: ['a', { c: true }] }, minItems: 1, maxItems: 2 },
    },
    required: ['color', 'level', 'shape', 'tags'],
    additionalProperties: false,
  },
  mixed: {
    $defs: { pos: { type: 'integer', minimum: 1 } },
    type: 'object',
    properties: {
      qty: { $ref: '#/$defs/pos', maximum: 9 },
      kind: { oneOf: [
        { type: 'object', properties: { t: { const: 'a' }, n: { type: 'integer', minimum: 0, maximum: 3 } }, required: ['t', 'n'], additionalProperties: false },
        { type: 'object', properties: { t: { const: 'b' } }, required: ['t'], additionalProperties: false }] },
      both: { allOf: [{ type: 'integer', maximum: 50 }, { minimum: 10, multipleOf: 7 }] },
    },
    required: ['qty', 'kind', 'both'],
    additionalProperties: false,
  },
};

// 20 samples of each kind; the ones that repeat what others cover get fewer.
const samplesOf = (name) => (name === 'mixed' ? 4 : name === 'long formats' ? 8 : SAMPLES);

async function sample(schema, seed) {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: `Sample ${seed}` }], temperature: 1, seed, max_tokens: 400,
    response_format: { type: 'json_schema', json_schema: { name: 'out', strict: true, schema } }, ...noThink,
  });
  return r.choices[0];
}

describe('schemas with ranges, patterns, formats and enums: sampled outputs validate with ajv', () => {
  for (const [name, schema] of Object.entries(schemas)) {
    it(`${name}: ${samplesOf(name)} samples`, async () => {
      const validate = ajv.compile(schema);
      const seen = new Set();
      for (let batch = 0; batch < samplesOf(name); batch += 4) {
        const choices = await Promise.all([0, 1, 2, 3].map((k) => sample(schema, 1000 + batch + k)));
        for (const c of choices) {
          assert.equal(c.finish_reason, 'stop', c.message.content);
          const value = JSON.parse(c.message.content);
          assert.ok(validate(value), `${c.message.content}\n${JSON.stringify(validate.errors)}`);
          seen.add(c.message.content);
        }
      }
      assert.ok(seen.size > 1, 'different seeds give different outputs');
    });
  }
});

describe('forced tool calls: arguments follow ranges, patterns and formats', () => {
  const parameters = {
    type: 'object',
    properties: {
      flight: { type: 'string', pattern: '^[A-Z]{2}\\d{2,4}$' },
      seats: { type: 'integer', minimum: 1, maximum: 9 },
      note: { type: ['string', 'null'], pattern: '^[a-z ]*$', maxLength: 4 },
    },
    required: ['flight', 'seats', 'note'],
  };
  const CALLS = 4;  // the XML format costs many tokens per call; the text tests walk these grammars at length
  it(`${CALLS} calls validate`, async () => {
    const validate = ajv.compile(parameters);
    for (let batch = 0; batch < CALLS; batch += 4) {
      const rs = await Promise.all([0, 1, 2, 3].map((k) => client.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: 'Book it' }], temperature: 1, seed: 2000 + batch + k,
        max_tokens: 700, tools: [{ type: 'function', function: { name: 'book', parameters } }],
        tool_choice: 'required', ...noThink,
      })));
      for (const r of rs) {
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
        const args = JSON.parse(c.message.tool_calls[0].function.arguments);
        assert.ok(validate(args), `${c.message.tool_calls[0].function.arguments}\n${JSON.stringify(validate.errors)}`);
      }
    }
  });
});

describe('keywords the grammar cannot honour are 400s naming them', () => {
  const refused = [
    [{ type: 'array', items: { type: 'integer' }, uniqueItems: true }, 'uniqueItems'],
    [{ type: 'object', properties: { a: { type: 'string' } }, minProperties: 1 }, 'minProperties'],
    [{ type: 'string', format: 'uri' }, 'format "uri"'],
    [{ type: 'string', pattern: '(\\w)\\1' }, 'backreference'],
    [{ type: 'string', pattern: 'a(?=b)' }, 'lookahead'],
    [{ type: 'number', multipleOf: 0.01 }, 'multipleOf 0.01'],
    [{ type: 'object', properties: { x: { type: 'string', maxLenght: 3 } } }, 'maxLenght'],
    [{ oneOf: [{ type: 'integer' }, { type: 'number' }] }, 'oneOf'],
    [{ not: { type: 'null' } }, '"not"'],
  ];
  for (const [schema, what] of refused) {
    it(what, async () => {
      await assert.rejects(
        client.chat.completions.create({
          model: 'tiny', messages: [{ role: 'user', content: 'x' }], max_tokens: 5,
          response_format: { type: 'json_schema', json_schema: { name: 'out', strict: true, schema } }, ...noThink,
        }),
        (err) => {
          assert.equal(err.status, 400);
          assert.ok(err.message.includes(what), err.message);
          assert.equal(err.param, 'response_format');
          return true;
        });
    });
  }
});
