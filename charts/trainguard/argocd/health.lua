-- Argo CD health of a trainguard.dev/TrainingRun, read from the conditions the operator writes.
--
-- Precedence, first match wins (docs/argocd.md explains each choice):
--   no status or no condition yet                                  -> Progressing
--   status older than the spec (observedGeneration < generation)   -> Progressing
--   Failed=True                                                    -> Degraded
--   Complete=True                                                  -> Healthy
--   Suspended=True                                                 -> Suspended
--   RepeatedFailureAtStep=True, whatever Ready and Degraded say    -> Degraded
--   Degraded=True                                                  -> Degraded
--   Ready=True                                                     -> Healthy
--   Progressing=True                                               -> Progressing
--   Progressing=False (the operator says the run is stuck)         -> Degraded
--   otherwise                                                      -> Progressing
-- A condition set for an older generation than the run's speaks of an earlier spec and does not
-- hold. The message is the deciding condition's "<reason>: <message>".
--
-- Argo CD runs scripts from argocd-cm with only the base, table and package libraries open:
-- this script uses nothing else (no string.*, no os.*).

local hs = {}
local WAITING = "Waiting for the trainguard operator to report on the run"

local function find(conditions, kind)
  for _, condition in ipairs(conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local generation = obj.metadata.generation

-- The operator sets its six standard conditions every cycle, but RepeatedFailureAtStep only
-- when a failure repeats: after a spec change it still carries the generation it was set for.
local function current(condition)
  return generation == nil or condition.observedGeneration == nil
    or condition.observedGeneration >= generation
end

local function holds(conditions, kind, status)
  local condition = find(conditions, kind)
  return condition ~= nil and condition.status == status and current(condition)
end

local function describe(condition)
  if condition.reason ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.reason .. ": " .. condition.message
  end
  return condition.reason or condition.message or condition.type
end

local function report(status, condition)
  hs.status = status
  hs.message = describe(condition)
  return hs
end

local status = obj.status
if status == nil or status.conditions == nil or #status.conditions == 0 then
  hs.status = "Progressing"
  hs.message = WAITING
  return hs
end

if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainguard operator to observe generation " .. tostring(generation)
    .. " (status is for generation " .. tostring(status.observedGeneration) .. ")"
  return hs
end

-- Each rule: the condition and status that decide, and the health they give.
local rules = {
  {"Failed", "True", "Degraded"},
  {"Complete", "True", "Healthy"},
  {"Suspended", "True", "Suspended"},
  -- Dying again near the same step is a pattern, not bad luck: it needs a person even while
  -- the operator keeps the run going (recovery.onRepeatedFailure: Continue), where the run
  -- reads Ready=True and Degraded=False once the trainer is restarted.
  {"RepeatedFailureAtStep", "True", "Degraded"},
  {"Degraded", "True", "Degraded"},
  {"Ready", "True", "Healthy"},
  -- Scheduling, starting, rescheduling after a failure: the operator is on its way.
  {"Progressing", "True", "Progressing"},
  -- Progressing=False without any of the above: the operator says the run cannot go on alone.
  {"Progressing", "False", "Degraded"},
}

local conditions = status.conditions
for _, rule in ipairs(rules) do
  if holds(conditions, rule[1], rule[2]) then
    return report(rule[3], find(conditions, rule[1]))
  end
end
hs.status = "Progressing"
hs.message = WAITING
return hs
