// qrig serve driven by the official @anthropic-ai/sdk: POST /v1/messages whole and streamed (.stream() and
// its final message, the exact event sequence on the wire), thinking enabled / disabled, a forced tool use
// whose input parses and follows the tool's schema (ajv), tool results sent back, stop_sequences and
// stop_reason, count_tokens, Anthropic's error shape and the x-api-key header.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { startServer } from './helpers.mjs';

const KEY = 'sk-ant-test-key';
let srv;
let client;
before(async () => {
  srv = await startServer({ args: ['--api-key', KEY] });
  client = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
});
after(async () => { await srv?.stop(); });

const WEATHER = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'],
    additionalProperties: false,
  },
};

// The wire events of a streamed request: [{event, data}], checking that each event's name is its data's type.
async function rawEvents(body) {
  const r = await fetch(`${srv.base}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  const text = await r.text();
  assert.ok(text.endsWith('\n\n'));
  return text.slice(0, -2).split('\n\n').map((part) => {
    const m = /^event: (\S+)\ndata: (.*)$/.exec(part);
    assert.ok(m, `bad event ${JSON.stringify(part)}`);
    const data = JSON.parse(m[2]);
    assert.equal(data.type, m[1]);
    return { event: m[1], data };
  });
}

// message_start ping (content_block_start content_block_delta* content_block_stop)* message_delta message_stop
function assertSequence(events) {
  const names = events.map((e) => e.event);
  assert.equal(names[0], 'message_start');
  assert.equal(names[1], 'ping');
  assert.deepEqual(names.slice(-2), ['message_delta', 'message_stop']);
  let open = -1, next = 0;
  for (const { event, data } of events.slice(2, -2)) {
    if (event === 'content_block_start') {
      assert.equal(open, -1);
      assert.equal(data.index, next);
      open = next++;
    } else if (event === 'content_block_delta') {
      assert.equal(data.index, open);
    } else {
      assert.equal(event, 'content_block_stop');
      assert.equal(data.index, open);
      open = -1;
    }
  }
  assert.equal(open, -1);
}

describe('Anthropic Messages API (@anthropic-ai/sdk)', () => {
  it('a whole message: shape, stop_reason, usage; count_tokens counts its input', async () => {
    const params = { model: 'tiny', max_tokens: 8, system: 'You are terse.', messages: [{ role: 'user', content: 'Hello' }] };
    const m = await client.messages.create(params);
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, 'tiny');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
    assert.equal(m.stop_sequence, null);
    assert.ok(m.content.every((b) => b.type === 'text'));
    assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 8);
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, 8);
    const counted = await client.messages.countTokens({ model: 'tiny', system: params.system, messages: params.messages });
    assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    // The system prompt as blocks is the same prompt.
    const blocks = await client.messages.countTokens({
      model: 'tiny', system: [{ type: 'text', text: 'You are terse.' }], messages: params.messages,
    });
    assert.equal(blocks.input_tokens, counted.input_tokens);
  });

  it('streamed with .stream(): the final message is the deltas; the wire has the exact event sequence', async () => {
    const params = { model: 'tiny', max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Tell me a story' }] };
    const stream = client.messages.stream(params);
    let text = '';
    stream.on('text', (t) => { text += t; });
    const final = await stream.finalMessage();
    const whole = await client.messages.create(params);
    assert.equal(final.content.map((b) => b.text).join(''), text);
    assert.deepEqual(final.content, whole.content);
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
    const events = await rawEvents(params);
    assertSequence(events);
    assert.equal(events[0].data.message.role, 'assistant');
    assert.deepEqual(events[0].data.message.content, []);
    const delta = events.at(-2).data;
    assert.equal(delta.delta.stop_reason, whole.stop_reason);
    assert.equal(delta.usage.output_tokens, whole.usage.output_tokens);
  });

  it('thinking enabled gives a thinking block first (thinking_delta on the wire); disabled gives none', async () => {
    const base = { model: 'tiny', max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Think first' }] };
    const on = await client.messages.create({ ...base, thinking: { type: 'enabled', budget_tokens: 4 } });
    assert.equal(on.content[0].type, 'thinking');
    assert.equal(typeof on.content[0].thinking, 'string');
    assert.equal(typeof on.content[0].signature, 'string');
    const events = await rawEvents({ ...base, thinking: { type: 'enabled', budget_tokens: 4 } });
    assertSequence(events);
    assert.equal(events[2].data.content_block.type, 'thinking');
    assert.ok(events.some((e) => e.data.delta?.type === 'thinking_delta'));
    const off = await client.messages.create({ ...base, thinking: { type: 'disabled' } });
    assert.ok(off.content.every((b) => b.type !== 'thinking'));
  });

  it('a forced tool use: stop_reason tool_use, the input follows the schema, whole and streamed', async () => {
    const validate = new Ajv().compile(WEATHER.input_schema);
    const params = {
      // Greedy: sampled from the random tiny model, a forced call can wander (whitespace inside the JSON) past
      // max_tokens now and then; greedy decoding makes the outcome the same on every run.
      model: 'tiny', max_tokens: 200, temperature: 0, tools: [WEATHER], tool_choice: { type: 'tool', name: 'get_weather' },
      messages: [{ role: 'user', content: 'Weather in Paris for 3 days?' }],
    };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1);
    for (const u of uses) {
      assert.equal(u.name, 'get_weather');
      assert.equal(typeof u.id, 'string');
      assert.ok(validate(u.input), JSON.stringify(validate.errors));
    }
    const final = await client.messages.stream(params).finalMessage();
    assert.equal(final.stop_reason, 'tool_use');
    const streamed = final.content.filter((b) => b.type === 'tool_use');
    assert.ok(streamed.length >= 1);
    for (const u of streamed) assert.ok(validate(u.input), JSON.stringify(validate.errors));
    const events = await rawEvents(params);
    assertSequence(events);
    assert.ok(events.some((e) => e.data.delta?.type === 'input_json_delta'));

    // tool_choice any forces a call too; the result goes back as a tool_result block.
    const any = await client.messages.create({ ...params, tool_choice: { type: 'any' } });
    assert.equal(any.stop_reason, 'tool_use');
    const use = any.content.find((b) => b.type === 'tool_use');
    const followUp = {
      model: 'tiny', tools: [WEATHER],
      messages: [...params.messages, { role: 'assistant', content: any.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 25 C, every day.' }] }],
    };
    const r = await client.messages.create({ ...followUp, max_tokens: 6 });
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(r.stop_reason));
    const withResult = await client.messages.countTokens(followUp);
    const withoutResult = await client.messages.countTokens({ ...followUp, messages: followUp.messages.slice(0, 2) });
    assert.ok(withResult.input_tokens > withoutResult.input_tokens);
  });

  it('stop_sequences end the output with stop_reason stop_sequence', async () => {
    const base = { model: 'tiny', max_tokens: 30, temperature: 0, messages: [{ role: 'user', content: 'Write a line' }] };
    const full = (await client.messages.create(base)).content.map((b) => b.text).join('');
    assert.ok(full.length >= 8, full);
    const stop = full.slice(4, 7);
    const m = await client.messages.create({ ...base, stop_sequences: [stop] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content.map((b) => b.text).join(''), full.slice(0, full.indexOf(stop)));
  });

  it('errors have Anthropic\'s shape: a wrong key is authentication_error, a bad request invalid_request_error', async () => {
    const wrong = new Anthropic({ baseURL: srv.base, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => {
        assert.ok(e instanceof Anthropic.AuthenticationError);
        assert.equal(e.status, 401);
        assert.equal(e.error.type, 'error');
        assert.equal(e.error.error.type, 'authentication_error');
        return true;
      });
    await assert.rejects(client.messages.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }] }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError);
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.match(e.error.error.message, /max_tokens/);
      return true;
    });
    await assert.rejects(client.messages.create({
      model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x' } }] }],
    }), (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.error.error.message));
    await assert.rejects(client.messages.create({
      model: 'tiny', max_tokens: 4, tools: [{ type: 'web_search_20250305', name: 'web_search' }],
      messages: [{ role: 'user', content: 'x' }],
    }), (e) => e instanceof Anthropic.BadRequestError && /web_search/.test(e.error.error.message));
  });
});
