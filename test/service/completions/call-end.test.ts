// CallEnd gives back a call's steering bytes and its admission place and settles its Hold once,
// however many times the call's paths end it (a refusal, an error, a consumer gone, a finally).
import { describe, expect, it } from "vitest";
import { createSteeringBudget } from "../../../src/lens/index.js";
import { createAdmission } from "../../../src/service/admission.js";
import { CallEnd } from "../../../src/service/completions/call-end.js";
import { admissionDefaults } from "../../helpers/config-defaults.js";

function heldCall() {
  const steeringBudget = createSteeringBudget({ requestBytes: 1024, processBytes: 4096 });
  const admission = createAdmission(admissionDefaults);
  const steering = steeringBudget.lease();
  steering.reserve(100);
  const ticket = admission.admit("key", {
    stream: true,
    modelId: "m",
    modelCapacity: 8,
    upstreamRequests: 1,
  });
  if (ticket instanceof Promise) throw new Error("a local admission answers at once");
  const settles: unknown[] = [];
  const call = new CallEnd({ steering, admission: ticket }, async (failure) => {
    // What the call held is given back before its Hold is settled.
    expect(steeringBudget.inFlight).toBe(0);
    expect(admission.inFlight("key").requests).toBe(0);
    settles.push(failure);
  });
  return { steeringBudget, admission, call, settles };
}

describe("CallEnd", () => {
  it("releases the lease and the ticket and settles once, with the first failure", async () => {
    const { steeringBudget, admission, call, settles } = heldCall();
    expect(steeringBudget.inFlight).toBe(100);
    expect(admission.inFlight("key").requests).toBe(1);
    expect(call.ended).toBe(false);
    const first = new Error("first");
    await Promise.all([call.end(first), call.end(new Error("second")), call.end()]);
    await call.end();
    expect(call.ended).toBe(true);
    expect(settles).toEqual([first]);
    expect(steeringBudget.inFlight).toBe(0);
    expect(admission.inFlight("key")).toMatchObject({ requests: 0, streams: 0 });
  });

  it("a later end() waits for the first one's settle", async () => {
    const { call, settles } = heldCall();
    const ending = call.end();
    const again = call.end();
    expect(again).toBe(ending);
    await again;
    expect(settles).toHaveLength(1);
  });
});
