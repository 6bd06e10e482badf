// Where decided() / decidedInputs() write (rank_divergence, digest.ts): the decision ring the
// agent's hello names. An agent known lost is not asked (''), a hello not yet said is said within
// the hello bound, and an agent that does not answer it is marked lost once and probed, never
// waited on per step.
import type { AgentAvailability } from './availability';
import type { AgentHello } from './hello';

export function decisionPathGate(hello: AgentHello, availability: AgentAvailability, helloBoundMs: number): () => Promise<string> {
  return async () => {
    if (availability.unavailable) return '';
    try {
      await hello.ensure(helloBoundMs);
    } catch (e) {
      if (!availability.lostOn(e, 'decided()')) throw e;
      return '';
    }
    return hello.decisionPath;
  };
}
