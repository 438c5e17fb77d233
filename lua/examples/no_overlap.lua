-- no_overlap.lua - turn ring overlap off, for debugging.
--
-- With overlap (the default) each ring step posts the send/recv of the next
-- K/V block, computes attention on the current block, and only then waits
-- for the transfer.  This script moves every `wait` of a ring loop up to
-- just after the recv of its tag, so each step finishes its transfer before
-- it computes: slower, but a hang or a wrong block then shows up at the step
-- where it happens.  Programs without a p2p ring loop (ulysses, allgather
-- rotation) are left as they are.
--
-- Use: cpc --lua lua/examples/no_overlap.lua PLAN.yaml
--      or `schedule: {script: no_overlap.lua}` in the plan.

function schedule(plan)
  local moved = 0
  cpc.walk(plan.ops, function(op)
    if op.kind ~= "loop" then return end
    local body = op.body
    local i = 1
    while i <= #body do
      local w = body[i]
      if w.kind == "wait" then
        -- the last send/recv of the same tag before the wait
        local last = nil
        for j = 1, i - 1 do
          local o = body[j]
          if (o.kind == "send" or o.kind == "recv") and o.tag == w.tag then last = j end
        end
        if last and last + 1 < i then
          cpc.move(body, i, last + 1)   -- legal swaps only; errors otherwise
          moved = moved + 1
        end
      end
      i = i + 1
    end
  end)
  if moved > 0 then plan.overlap = false end
end
