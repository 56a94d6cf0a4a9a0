-- Argo CD resource health check for managedjobs.dev/ManagedJob.
-- Install as `resource.customizations.health.managedjobs.dev_ManagedJob` in argocd-cm
-- (examples/gitops/README.md). Tested against every phase by hack/gitops (`cargo test --test gitops`).
--
-- Argo CD runs this with only the base, table, package and a safe os library: no `string`
-- library, so no string.format / s:sub here.
--
-- Verdicts (the same as kstatus reads from the conditions; docs/design.md#the-api):
--   Pending, Submitted, Starting, Recovering, Cancelling        -> Progressing
--   Running, Succeeded                                          -> Healthy (batch/v1 Job precedent:
--                                                                  a started job is healthy)
--   Failed, FailedSetup, FailedPrecheck, FailedNoResource,
--   FailedController                                            -> Degraded
--   Cancelled                                                   -> Degraded: a stopped job did not do
--                                                                  its work, so it is not healthy
--   a pipeline (status.tasks) not finished, even Running        -> Progressing: a running task is
--                                                                  one step of the job
--   no status yet, or status of an older metadata.generation    -> Progressing
--   a phase this script does not know                           -> from the conditions
--                                                                  (Stalled / Ready / Reconciling)

local verdicts = {
  Pending = "Progressing",
  Submitted = "Progressing",
  Starting = "Progressing",
  Recovering = "Progressing",
  Cancelling = "Progressing",
  Running = "Healthy",
  Succeeded = "Healthy",
  Failed = "Degraded",
  FailedSetup = "Degraded",
  FailedPrecheck = "Degraded",
  FailedNoResource = "Degraded",
  FailedController = "Degraded",
  -- Cancelled is terminal and the work was not done: Degraded, not Healthy (nor Suspended,
  -- which Argo CD reserves for something that can resume).
  Cancelled = "Degraded",
}

hs = {}

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local phase = status.phase
local message = phase
if status.failureReason ~= nil and status.failureReason ~= "" and verdicts[phase] == "Degraded" then
  message = message .. " (" .. status.failureReason .. ")"
end
if status.message ~= nil and status.message ~= "" then
  message = message .. ": " .. status.message
end

local verdict = verdicts[phase]
if verdict == "Healthy" and phase ~= "Succeeded" and status.tasks ~= nil and #status.tasks > 0 then
  -- A pipeline is in progress until its last task ends.
  verdict = "Progressing"
end
if verdict == nil then
  -- A phase newer than this script: trust the conditions, in kstatus's order.
  local on = {}
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.status == "True" then
        on[c.type] = true
      end
    end
  end
  if on.Stalled then
    verdict = "Degraded"
  elseif on.Reconciling then
    verdict = "Progressing"
  elseif on.Ready then
    verdict = "Healthy"
  else
    verdict = "Unknown"
  end
end

hs.status = verdict
hs.message = message
return hs
