// Tool calls and structured output end to end with the random-weight model: tool_choice "required" or a
// named function and response_format json_schema / json_object force well-formed output through constrained
// decoding, so the OpenAI wire format (whole and streamed) can be checked exactly: first delta of each call
// with index, id, type and name, later deltas argument fragments, finish_reason "tool_calls".
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, chatRequest, postJSON } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer({ parallel: 2 });
  client = srv.client();
});
after(async () => { await srv?.stop(); });

// String parameters are free text up to "</parameter>": maxLength keeps a random model's values short.
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' },
      unit: { type: 'string', enum: ['C', 'F'] } }, required: ['city', 'days'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {
    zone: { type: 'string', maxLength: 8 } }, required: ['zone'] } } },
];
const noThink = { chat_template_kwargs: { enable_thinking: false } };

function checkArguments(name, args) {
  const a = JSON.parse(args);
  assert.equal(typeof a, 'object');
  if (name === 'get_weather') {
    assert.equal(typeof a.city, 'string');
    assert.ok([...a.city].length <= 12);
    assert.ok(Number.isInteger(a.days), args);
    if ('unit' in a) assert.ok(['C', 'F'].includes(a.unit));
    for (const k of Object.keys(a)) assert.ok(['city', 'days', 'unit'].includes(k), k);
  } else {
    assert.equal(name, 'get_time');
    assert.equal(typeof a.zone, 'string');
    assert.deepEqual(Object.keys(a), ['zone']);
  }
  return a;
}

// Reassembles streamed tool calls, checking the wire format of every delta.
async function streamedCalls(req) {
  const s = await client.chat.completions.create({ ...req, stream: true });
  const calls = [];
  let finish = null;
  let content = '';
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    finish = c.finish_reason ?? finish;
    if (c.finish_reason) assert.equal(c.delta.tool_calls, undefined, 'no calls in the finish chunk');
    content += c.delta.content ?? '';
    for (const tc of c.delta.tool_calls ?? []) {
      if (tc.id !== undefined) {
        assert.equal(tc.index, calls.length, 'each call opens with the next index');
        assert.equal(tc.type, 'function');
        assert.equal(typeof tc.function.name, 'string');
        assert.equal(tc.function.arguments, '');
        calls.push({ id: tc.id, name: tc.function.name, arguments: '' });
      } else {
        assert.equal(tc.index, calls.length - 1, 'fragments belong to the open call');
        assert.equal(tc.type, undefined);
        assert.equal(tc.function.name, undefined);
        calls[tc.index].arguments += tc.function.arguments;
      }
    }
  }
  return { calls, finish, content };
}

describe('tool calls', () => {
  it('tool_choice "required": a well-formed call, whole and streamed alike', async () => {
    const req = chatRequest("What's the weather in Paris for 3 days?", { tools, tool_choice: 'required', temperature: 0, max_tokens: 200, ...noThink });
    const r = await client.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.ok(m.tool_calls.length >= 1);
    const ids = new Set();
    for (const tc of m.tool_calls) {
      assert.equal(tc.type, 'function');
      assert.match(tc.id, /^call_/);
      ids.add(tc.id);
      checkArguments(tc.function.name, tc.function.arguments);
    }
    assert.equal(ids.size, m.tool_calls.length);
    const s = await streamedCalls(req);
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.content, '');
    assert.deepEqual(s.calls.map((c) => [c.name, JSON.parse(c.arguments)]),
      m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]));
  });

  it('a named function is the one called; parallel_tool_calls false gives exactly one call', async () => {
    const req = chatRequest('Time in Tokyo?', {
      tools, tool_choice: { type: 'function', function: { name: 'get_time' } }, parallel_tool_calls: false,
      temperature: 0.8, seed: 7, max_tokens: 200, ...noThink,
    });
    const r = await client.chat.completions.create(req);
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_time');
    checkArguments('get_time', calls[0].function.arguments);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const s = await streamedCalls(req);
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].name, 'get_time');
    assert.equal(s.calls[0].arguments, calls[0].function.arguments);
  });

  it('a tool result sent back is rendered and answered', async () => {
    const first = await client.chat.completions.create(chatRequest('Weather in Oslo?', {
      tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 200, ...noThink,
    }));
    const call = first.choices[0].message.tool_calls[0];
    const followUp = {
      model: 'tiny', tools, temperature: 0, max_tokens: 8, ...noThink,
      messages: [
        { role: 'user', content: 'Weather in Oslo?' },
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' },
      ],
    };
    const r = await client.chat.completions.create(followUp);
    assert.equal(r.object, 'chat.completion');
    assert.ok(r.usage.prompt_tokens > first.usage.prompt_tokens);
    // The prompt the server built is the one /tokenize builds for the same messages (same count), and it holds
    // the call as the template renders it and the tool's result in a tool_response block.
    const tk = await postJSON(srv.base, '/tokenize', { messages: followUp.messages, tools, ...noThink });
    assert.equal(tk.status, 200, tk.text);
    assert.equal(tk.json.count, r.usage.prompt_tokens);
    const text = (await postJSON(srv.base, '/detokenize', { tokens: tk.json.tokens })).json.content;
    const args = JSON.parse(call.function.arguments);
    const params = Object.entries(args).map(([k, v]) => `<parameter=${k}>\n${typeof v === 'string' ? v : JSON.stringify(v)}\n</parameter>\n`).join('');
    assert.ok(text.includes(`<tool_call>\n<function=${call.function.name}>\n${params}</function>\n</tool_call>`), text);
    assert.ok(text.includes('<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'), text);
  });

  it('tool_choice "auto" leaves the model free and the response well-formed', async () => {
    const r = await client.chat.completions.create(chatRequest('Anything', { tools, temperature: 0, max_tokens: 16 }));
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
    for (const tc of r.choices[0].message.tool_calls ?? []) checkArguments(tc.function.name, tc.function.arguments);
  });
});

describe('structured output', () => {
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer' }, ok: { type: 'boolean' },
      tags: { type: 'array', items: { type: 'string', enum: ['a', 'b'] }, maxItems: 3 } },
    required: ['name', 'age', 'ok'],
  };
  const rf = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };

  function checkPerson(text) {
    const v = JSON.parse(text);
    assert.equal(typeof v.name, 'string');
    assert.ok([...v.name].length <= 10);
    assert.ok(Number.isInteger(v.age));
    assert.equal(typeof v.ok, 'boolean');
    if ('tags' in v) { assert.ok(v.tags.length <= 3); for (const t of v.tags) assert.ok(['a', 'b'].includes(t)); }
  }

  it('response_format json_schema: content is JSON of the schema, whole and streamed', async () => {
    const req = chatRequest('Describe a person', { response_format: rf, temperature: 0, max_tokens: 300, ...noThink });
    const r = await client.chat.completions.create(req);
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkPerson(r.choices[0].message.content);
    const s = await client.chat.completions.create({ ...req, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.delta?.content ?? '';
    assert.equal(text, r.choices[0].message.content);
  });

  it('response_format json_object: content is a finished JSON object', async () => {
    // Left alone the random-weight model writes one endless string; a small bias on '"' and '}' (ids from
    // /tokenize) lets it close what it opens, so the object finishes well within max_tokens.
    const ids = (await postJSON(srv.base, '/tokenize', { content: '"}' })).json.tokens;
    assert.equal(ids.length, 2);
    const r = await client.chat.completions.create(chatRequest('JSON please', {
      response_format: { type: 'json_object' }, temperature: 0, max_tokens: 400, ...noThink,
      logit_bias: { [ids[0]]: 3, [ids[1]]: 3 },
    }));
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
    assert.ok(Object.keys(v).length >= 1, r.choices[0].message.content);
  });

  it('a schema the grammar cannot honour is a 400 naming response_format', async () => {
    await assert.rejects(client.chat.completions.create(chatRequest('x', {
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: { type: 'string' } } } },
    })), (e) => e.status === 400 && e.param === 'response_format');
  });
});
