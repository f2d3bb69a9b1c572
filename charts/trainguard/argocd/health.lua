-- Argo CD health of a trainguard.dev/TrainingRun, read from the conditions the operator writes.
--
-- Precedence, first match wins (docs/argocd.md explains each choice):
--   status older than the spec (observedGeneration < generation)  -> Progressing
--   Failed=True                                                   -> Degraded
--   Complete=True                                                 -> Healthy
--   Suspended=True                                                -> Suspended
--   Degraded=True and RepeatedFailureAtStep=True                  -> Degraded
--   Degraded=True and Progressing=True (restart, reschedule)      -> Progressing
--   Degraded=True                                                 -> Degraded
--   Ready=True                                                    -> Healthy
--   Progressing=True                                              -> Progressing
--   Progressing=False (the operator says the run is stuck)        -> Degraded
--   no status or no condition yet                                 -> Progressing
-- The message is the deciding condition's "<reason>: <message>".
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

local function holds(conditions, kind)
  local condition = find(conditions, kind)
  return condition ~= nil and condition.status == "True"
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

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainguard operator to observe generation " .. tostring(generation)
    .. " (status is for generation " .. tostring(status.observedGeneration) .. ")"
  return hs
end

local conditions = status.conditions
if holds(conditions, "Failed") then
  return report("Degraded", find(conditions, "Failed"))
end
if holds(conditions, "Complete") then
  return report("Healthy", find(conditions, "Complete"))
end
if holds(conditions, "Suspended") then
  return report("Suspended", find(conditions, "Suspended"))
end
if holds(conditions, "Degraded") then
  -- Dying again near the same step is a pattern, not a transient: it needs a person even
  -- while the operator keeps trying (recovery.onRepeatedFailure: Continue).
  if holds(conditions, "RepeatedFailureAtStep") then
    return report("Degraded", find(conditions, "RepeatedFailureAtStep"))
  end
  -- A restart or reschedule under way is the operator doing its job: Progressing, so Argo CD
  -- neither alerts nor fails a sync wave for a recovery that is expected to succeed.
  if holds(conditions, "Progressing") then
    return report("Progressing", find(conditions, "Degraded"))
  end
  return report("Degraded", find(conditions, "Degraded"))
end
if holds(conditions, "Ready") then
  return report("Healthy", find(conditions, "Ready"))
end
local progressing = find(conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  return report("Progressing", progressing)
end
if progressing ~= nil and progressing.status == "False" then
  return report("Degraded", progressing)
end
hs.status = "Progressing"
hs.message = WAITING
return hs
