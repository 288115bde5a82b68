// `npm start`: record a small demo run into ./.little-workflow and print what was stored.
//
// The run is what a workflow runtime driving an agent would record: a run and a step starting,
// a harness session with one model call and one tool call, the step's output and the run's end.
import { createHash, randomUUID } from 'node:crypto';
import { appendEvent, canonicalize, listEvents, localWorld, materializeRunState } from '@little-workflow/world';

const world = localWorld(); // ./.little-workflow, durability 'full'
const runId = `run_demo_${randomUUID().slice(0, 8)}`;
const key = (name) => `${runId}:${name}`;
const manifest = { harnessId: 'workflowHarness@1.0.0', plannerModelSlotId: 'gpt-5' };
const manifestHash = `sha256:${createHash('sha256').update(canonicalize(manifest)).digest('hex')}`;

const facts = [
  { type: 'RunStarted', payload: { workflowVersionId: 'wv_demo_1', input: { topic: 'durable execution' } } },
  { type: 'StepStarted', payload: { stepPath: 'research', stepKind: 'ai.generate', attempt: 1 } },
  {
    type: 'harness.session.started',
    appendIdempotencyKey: key('session'),
    payload: { runId, role: 'worker.ai-generate', task: { kind: 'execute_step' }, manifest, manifestHash },
  },
  {
    type: 'harness.model.called',
    appendIdempotencyKey: key('model-called-1'),
    payload: { turn: 1, promptHash: 'sha256:demo-prompt', request: { model: 'gpt-5', messages: [{ role: 'user', content: 'Summarize durable execution.' }], tools: [{ toolName: 'search' }] } },
  },
  {
    type: 'harness.tool_call.started',
    appendIdempotencyKey: key('tool-started-1'),
    payload: { turn: 1, callId: 'call_search_1', caller: 'model', toolName: 'search', args: { q: 'durable execution event log' } },
  },
  {
    type: 'harness.tool_call.succeeded',
    appendIdempotencyKey: key('tool-succeeded-1'),
    payload: { callId: 'call_search_1', result: { hits: 3 }, durationMs: 42 },
  },
  {
    type: 'harness.model.responded',
    appendIdempotencyKey: key('model-responded-1'),
    payload: {
      turn: 1,
      callId: 'call_model_1',
      stepPath: 'research',
      model: { provider: 'openai', modelId: 'gpt-5' },
      response: { text: 'An append-only log, replayed.', usage: { inputTokens: 1200, outputTokens: 300, cachedInputTokens: 200, reasoningTokens: 100 } },
    },
  },
  {
    type: 'harness.session.completed',
    appendIdempotencyKey: key('session-completed'),
    payload: { runId, output: { summary: 'An append-only log, replayed.' }, usage: { inputTokens: 1200, outputTokens: 300, cachedInputTokens: 200, reasoningTokens: 100 } },
  },
  { type: 'StepCompleted', payload: { stepPath: 'research', output: { summary: 'An append-only log, replayed.' } } },
  { type: 'RunCompleted', payload: { output: { summary: 'An append-only log, replayed.' } } },
];

for (const fact of facts) await appendEvent(world, runId, fact);
const events = await listEvents(world, runId);
console.log(`Recorded ${events.length} events of ${runId} in ${world.dataDir}\n`);
for (const e of events) console.log(JSON.stringify(e));
const state = await materializeRunState(world, runId);
const cost = (u) => (u.costUsd === null ? 'unpriced' : `$${u.costUsd}`);
console.log(`\n${runId}: ${state.status}, ${state.usage.inputTokens} input / ${state.usage.outputTokens} output tokens, ${cost(state.usage)} (prices as of ${state.pricingAsOf})`);
for (const [path, step] of Object.entries(state.steps)) console.log(`  step ${path}: ${step.status}, ${cost(step.usage)}`);
await world.close();
