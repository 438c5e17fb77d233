-- ring_across_nodes.lua - choose: Ulysses inside a node, ring across nodes.
--
-- Ulysses' all-to-all moves ~4/P of the activations per rank but needs every
-- member of the group to talk to every other one: over InfiniBand that is
-- slow.  Ring only talks to its neighbour and overlaps the transfer with
-- attention.  Ranks map to nodes in blocks (rank r is on node
-- r / gpus_per_node) and the ulysses group is the inner axis of the mesh,
-- so a ulysses group stays inside one node exactly when ulysses_degree
-- divides gpus_per_node.  This policy:
--   * on one node: the fastest candidate (as cpc would choose);
--   * across nodes: among the candidates whose ulysses group stays inside a
--     node (ring, ring_anything, unified with U | gpus_per_node), the one
--     with the largest ulysses_degree (the most NVLink traffic, the least
--     ring traffic), ties to the faster one; if none, the fastest.
--
-- Use: cpc --lua lua/examples/ring_across_nodes.lua PLAN.yaml  (variant: auto)

local function faster(a, b)
  if a.predicted_ms and b.predicted_ms then return a.predicted_ms < b.predicted_ms end
  return a.predicted_ms ~= nil
end

function choose(candidates, config)
  local gpn = config.cluster.gpus_per_node
  local fastest = candidates[1]
  for _, c in ipairs(candidates) do
    if faster(c, fastest) then fastest = c end
  end
  if config.cluster.nodes <= 1 then return fastest end
  local best
  for _, c in ipairs(candidates) do
    if gpn % c.ulysses_degree == 0 then
      if best == nil or c.ulysses_degree > best.ulysses_degree
         or (c.ulysses_degree == best.ulysses_degree and faster(c, best)) then
        best = c
      end
    end
  end
  return best or fastest
end
