// Graceful shutdown of the real process: on SIGTERM (or SIGINT) requests in flight complete, new connections
// are refused, and the process exits 0; past --shutdown-timeout, what still runs is cancelled (a streamed
// request ends with an error event) and the process still exits 0.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, sleep, chatRequest, EOG_BAN } from './helpers.mjs';

async function exitWithin(srv, ms) {
  const t = setTimeout(() => srv.proc.kill('SIGKILL'), ms);
  const r = await srv.exited;
  clearTimeout(t);
  return r;
}

describe('graceful shutdown', () => {
  for (const signal of ['SIGTERM', 'SIGINT']) {
    it(`${signal}: streamed and whole requests in flight complete, then exit 0`, async () => {
      // Longer than the default drain (8 s): on a loaded 2-core CI machine the two requests take more than that.
      const srv = await startServer({ parallel: 2, args: ['--shutdown-timeout', '60'] });
      const client = srv.client();
      const stream = await client.chat.completions.create(chatRequest('keep going', {
        max_tokens: 150, temperature: 0, logit_bias: EOG_BAN, stream: true,
      }));
      const iter = stream[Symbol.asyncIterator]();
      const first = await iter.next();
      assert.equal(first.value.choices[0].delta.role, 'assistant');
      const whole = postJSON(srv.base, '/v1/chat/completions', chatRequest('and this one', { max_tokens: 120, logit_bias: EOG_BAN }));
      for (let i = 0; i < 200; ++i) {
        const h = await (await fetch(`${srv.base}/health`)).json();
        if (h.slots_processing === 2) break;
        await sleep(10);
      }
      srv.proc.kill(signal);
      let finish = null;
      let chunks = 1;
      for (let r = await iter.next(); !r.done; r = await iter.next()) {
        chunks += 1;
        finish = r.value.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, 'length');
      assert.ok(chunks > 100);
      const w = await whole;
      assert.equal(w.status, 200, w.text);
      assert.equal(w.json.usage.completion_tokens, 120);
      const { code, signal: sig } = await exitWithin(srv, 20_000);
      assert.equal(sig, null);
      assert.equal(code, 0, srv.log());
      await assert.rejects(fetch(`${srv.base}/health`));
    });
  }

  it('past --shutdown-timeout the requests still running are cancelled and the process exits 0', async () => {
    const srv = await startServer({ parallel: 1, args: ['--shutdown-timeout', '1'] });
    const client = srv.client();
    const stream = await client.chat.completions.create(chatRequest('forever', {
      max_tokens: 1900, logit_bias: EOG_BAN, stream: true,
    }));
    const iter = stream[Symbol.asyncIterator]();
    await iter.next();
    await iter.next();
    const t0 = Date.now();
    srv.proc.kill('SIGTERM');
    await assert.rejects((async () => { for (let r = await iter.next(); !r.done; r = await iter.next()); })(), (e) => {
      assert.equal(e.error?.type, 'unavailable_error', String(e));
      return true;
    });
    const { code } = await exitWithin(srv, 20_000);
    assert.equal(code, 0, srv.log());
    assert.ok(Date.now() - t0 < 8000);
  });

});
