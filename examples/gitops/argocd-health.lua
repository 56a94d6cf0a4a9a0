-- Argo CD resource health check for managedjobs.dev/ManagedJob.
-- Install as `resource.customizations.health.managedjobs.dev_ManagedJob` in argocd-cm
-- (examples/gitops/README.md). Tested against every phase by hack/gitops (`cargo test --test gitops`).
--
-- Argo CD runs this with only the base, table, package and a safe os library: no `string`
-- library, so no string.format / s:sub here.
--
-- The verdict is kstatus's reading of the operator's conditions (src/status.rs), so that Argo CD
-- and Flux always agree; a job is in progress until it finishes, as Argo CD treats a batch/v1 Job:
--   no status yet, or a status of an older metadata.generation  -> Progressing
--   Reconciling True (Pending, Submitted, Starting, Running,
--     Recovering, Cancelling: any live job, a pipeline's too)   -> Progressing
--   Stalled True (Failed, FailedSetup, FailedPrecheck,
--     FailedNoResource, FailedController; a Cancelled job whose
--     spec.cancel was set back to false)                        -> Degraded
--   Suspended True (spec.suspend holds it; Ready, not Reconciling) -> Suspended
--   Ready True (Succeeded; Cancelled as spec.cancel asks)       -> Healthy
--   none of them True                                           -> Progressing
-- The message is the phase, the failure reason for a Degraded job, then the condition's message
-- (the job's own: exit code, budgets spent).

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

-- kstatus's order: the first True of Reconciling and Stalled in list order, then Ready.
local verdict = nil
local text = nil
local ready = nil
local suspended = nil
if status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if verdict == nil and c.status == "True" then
      if c.type == "Reconciling" then
        verdict = "Progressing"
        text = c.message
      elseif c.type == "Stalled" then
        verdict = "Degraded"
        text = c.message
      end
    end
    if c.type == "Ready" then
      ready = c
    end
    if c.type == "Suspended" and c.status == "True" then
      suspended = c
    end
  end
end
if verdict == nil and suspended ~= nil then
  verdict = "Suspended"
  text = suspended.message
end
if verdict == nil then
  if ready ~= nil and ready.status == "True" then
    verdict = "Healthy"
    text = ready.message
  else
    verdict = "Progressing"
  end
end
if text == nil or text == "" then
  text = status.message
end

local message = status.phase
if verdict == "Degraded" and status.failureReason ~= nil and status.failureReason ~= "" then
  message = message .. " (" .. status.failureReason .. ")"
end
if text ~= nil and text ~= "" then
  message = message .. ": " .. text
end

hs.status = verdict
hs.message = message
return hs
