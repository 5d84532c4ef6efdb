// qrig serve driven by the openai SDK (current major): POST /v1/responses whole and streamed (the SDK's
// ResponseStream checks every event against its snapshot: item ids, output and content indexes, the final
// response), string and item input with instructions, a function call (forced and sent back as
// function_call_output), text.format json_schema (20 samples validate with ajv), reasoning items, usage,
// store: false semantics and previous_response_id refused.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { startServer, postJSON } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer();
  client = srv.client();
});
after(async () => { await srv?.stop(); });

const WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'],
    additionalProperties: false,
  },
  strict: true,
};

// The raw events of a streamed request: [{event, data}], the event name equal to data.type, sequence numbers 0, 1, 2...
async function rawEvents(body) {
  const r = await fetch(`${srv.base}/v1/responses`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  const text = await r.text();
  return text.slice(0, -2).split('\n\n').map((part, i) => {
    const m = /^event: (\S+)\ndata: (.*)$/.exec(part);
    assert.ok(m, `bad event ${JSON.stringify(part)}`);
    const data = JSON.parse(m[2]);
    assert.equal(data.type, m[1]);
    assert.equal(data.sequence_number, i);
    return data;
  });
}

describe('Responses API (openai SDK)', () => {
  it('string input with instructions: a completed response with a message item and usage', async () => {
    const r = await client.responses.create({
      model: 'tiny', input: 'Hello', instructions: 'Be terse.', max_output_tokens: 10, reasoning: { effort: 'none' },
    });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(r.status));
    if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(r.store, false);
    const msg = r.output.find((o) => o.type === 'message');
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.equal(r.output_text, msg.content[0].text);
    assert.ok(r.output.every((o) => o.type !== 'reasoning'));
    const t = await postJSON(srv.base, '/tokenize', {
      messages: [{ role: 'system', content: 'Be terse.' }, { role: 'user', content: 'Hello' }], enable_thinking: false,
    });
    assert.equal(r.usage.input_tokens, t.json.count);
    assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 10);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    // Item input (a developer message, an earlier assistant turn) is the same conversation as chat messages.
    const items = await client.responses.create({
      model: 'tiny', max_output_tokens: 4, reasoning: { effort: 'none' },
      input: [{ role: 'developer', content: 'Be terse.' }, { role: 'user', content: [{ type: 'input_text', text: 'Hello' }] },
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Hi.' }] }, { role: 'user', content: 'Again' }],
    });
    const t2 = await postJSON(srv.base, '/tokenize', {
      messages: [{ role: 'system', content: 'Be terse.' }, { role: 'user', content: 'Hello' }, { role: 'assistant', content: 'Hi.' },
        { role: 'user', content: 'Again' }], enable_thinking: false,
    });
    assert.equal(items.usage.input_tokens, t2.json.count);
  });

  it('streamed: the SDK accepts every event; the final response is the whole one', async () => {
    const params = { model: 'tiny', input: 'Tell me a story', max_output_tokens: 24, temperature: 0 };
    const stream = client.responses.stream(params);
    const types = [];
    let reasoning = '', text = '';
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.reasoning_text.delta') reasoning += ev.delta;
    }
    const final = await stream.finalResponse();
    const whole = await client.responses.create(params);
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
    assert.equal(final.status, whole.status);
    assert.equal(final.output_text, text);
    assert.equal(whole.output_text, text);
    const rs = final.output.find((o) => o.type === 'reasoning');
    assert.ok(rs, 'thinking is on by default: a reasoning item');
    assert.equal(rs.content[0].text, reasoning);
    assert.equal(whole.output.find((o) => o.type === 'reasoning').content[0].text, reasoning);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
    assert.ok(final.usage.output_tokens_details.reasoning_tokens > 0);
    // On the wire: each item is added, filled and done, in output order.
    const events = await rawEvents(params);
    const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => e.output_index);
    const done = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.output_index);
    assert.deepEqual(added, [...added.keys()]);
    assert.deepEqual(done, added);
  });

  it('a forced function call: arguments follow the schema, whole and streamed; the output goes back in', async () => {
    const validate = new Ajv().compile(WEATHER.parameters);
    const params = {
      model: 'tiny', input: 'Weather in Paris for 3 days?', tools: [WEATHER], tool_choice: { type: 'function', name: 'get_weather' },
      max_output_tokens: 200, reasoning: { effort: 'none' },
      temperature: 0,  // greedy: a sampled forced call from the random tiny model can run past the limit (anthropic.test.mjs)
    };
    const r = await client.responses.create(params);
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.ok(calls.length >= 1, JSON.stringify(r.output));
    for (const c of calls) {
      assert.equal(c.name, 'get_weather');
      assert.equal(typeof c.call_id, 'string');
      assert.ok(validate(JSON.parse(c.arguments)), JSON.stringify(validate.errors));
    }
    const final = await client.responses.stream(params).finalResponse();
    const streamed = final.output.filter((o) => o.type === 'function_call');
    assert.ok(streamed.length >= 1);
    for (const c of streamed) assert.ok(validate(JSON.parse(c.arguments)), JSON.stringify(validate.errors));
    const events = await rawEvents(params);
    assert.ok(events.some((e) => e.type === 'response.function_call_arguments.delta'));

    const followUp = await client.responses.create({
      model: 'tiny', tools: [WEATHER], max_output_tokens: 6, reasoning: { effort: 'none' },
      input: [{ role: 'user', content: 'Weather in Paris for 3 days?' }, ...r.output,
        { type: 'function_call_output', call_id: calls[0].call_id, output: 'Sunny, 25 C.' }],
    });
    assert.ok(['completed', 'incomplete'].includes(followUp.status));
    assert.ok(followUp.usage.input_tokens > r.usage.input_tokens);
  });

  it('text.format json_schema: 20 sampled outputs validate', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', pattern: '^[A-Z][a-z]{1,8}$' }, age: { type: 'integer', minimum: 0, maximum: 120 },
        tag: { enum: ['a', 'b', 'c'] } },
      required: ['name', 'age', 'tag'],
      additionalProperties: false,
    };
    const validate = new Ajv().compile(schema);
    for (let i = 0; i < 20; i++) {
      const r = await client.responses.create({
        model: 'tiny', input: 'A person as JSON', max_output_tokens: 300, temperature: 1,
        reasoning: { effort: 'none' }, text: { format: { type: 'json_schema', name: 'person', schema, strict: true } },
      });
      assert.equal(r.status, 'completed');
      assert.ok(validate(JSON.parse(r.output_text)), `${r.output_text}: ${JSON.stringify(validate.errors)}`);
    }
  });

  it('nothing is stored: previous_response_id and item references are 400s naming the field', async () => {
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: 'resp_123' }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'previous_response_id');
      assert.match(e.message, /stores no responses/);
      return true;
    });
    await assert.rejects(client.responses.create({ model: 'tiny', input: [{ type: 'item_reference', id: 'msg_1' }] }),
      (e) => e.status === 400 && e.param === 'input');
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', tools: [{ type: 'web_search' }] }),
      (e) => e.status === 400 && e.param === 'tools');
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 0 }),
      (e) => e.status === 400 && e.param === 'max_output_tokens');
    const ok = await client.responses.create({ model: 'tiny', input: 'x', store: false, max_output_tokens: 2, metadata: { a: 'b' } });
    assert.equal(ok.store, false);
    assert.deepEqual(ok.metadata, { a: 'b' });
  });
});
