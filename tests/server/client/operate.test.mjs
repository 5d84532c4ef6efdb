// Operating `qrig serve` (issue 14), on a `qrig synth` model so that these tests need no fixtures: the load
// progress and the per-device memory summary in its output.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, startServer } from './helpers.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qrig-operate-'));
const MODEL = path.join(dir, 'synth-tiny.gguf');

before(() => {
  execFileSync(BINARY, ['synth', '--preset', 'tiny', '--seed', '11', '-o', MODEL], { stdio: 'ignore' });
});
after(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('loading', () => {
  it('prints the load progress, the memory per device and "ready in N s" (synth model, CPU)', async () => {
    const srv = await startServer({ model: MODEL, parallel: 2, ctx: 1024 });
    try {
      const log = srv.log();
      assert.match(log, /qrig serve: compiled a plan for .*synth-tiny\.gguf: cpu backend, context 1024 tokens x 2 slots/);
      // Not a terminal: a line when the stage starts and one when it is done.
      assert.match(log, /qrig serve: reading weights: 0% \(0 B of [0-9.]+ MiB\)\n/);
      assert.match(log, /qrig serve: reading weights: done, [0-9.]+ MiB in [0-9.]+ s\n/);
      assert.match(log, /qrig serve: memory on cpu: weights [0-9.]+ MiB, KV cache [0-9.]+ [KMG]iB, GDN state [0-9.]+ [KMG]iB, activations [0-9.]+ [KMG]iB, snapshots [0-9.]+ [KMG]iB: [0-9.]+ [KMG]iB of the plan's [0-9.]+ [KMG]iB budget, [0-9.]+ [KMG]iB free\n/);
      assert.match(log, /qrig serve: ready in [0-9]+\.[0-9] s: model 'synth-tiny'/);
      // The order a user reads: progress, memory, ready.
      assert.ok(log.indexOf('reading weights: done') < log.indexOf('memory on cpu'));
      assert.ok(log.indexOf('memory on cpu') < log.indexOf('ready in'));
    } finally {
      await srv.stop();
    }
  });
});
