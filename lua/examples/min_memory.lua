-- min_memory.lua - choose the candidate with the least memory per rank.
--
-- For `variant: auto` (or `fallback: auto`) cpc picks the fastest valid
-- candidate (SPEC section 1).  When memory is what limits you (a large
-- model already holds most of the device: cluster.reserved_gb), this
-- policy picks the valid candidate with the smallest predicted peak memory
-- per rank instead; ties (within 1%) go to the faster one, then to the
-- candidates' order (ulysses, unified, ring, ...).
--
-- Use: cpc --lua lua/examples/min_memory.lua PLAN.yaml   (with variant: auto)

function choose(candidates)
  local best
  for _, c in ipairs(candidates) do
    if c.memory_bytes then             -- unpriced candidates have no figures
      if best == nil
         or c.memory_bytes < best.memory_bytes * 0.99
         or (c.memory_bytes <= best.memory_bytes * 1.01 and c.predicted_ms < best.predicted_ms) then
        best = c
      end
    end
  end
  return best or candidates[1]
end
