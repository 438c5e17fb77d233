-- allgather.lua - all-gather rotation instead of peer-to-peer.
--
-- The compiler's default ring schedule (rotate: p2p) passes K/V blocks
-- around the ring with send/recv, double-buffered: O(S/P) K/V memory per
-- rank, transfers overlapped with attention.  diffusers instead all-gathers
-- K and V over the ring group once and then attends to each block of the
-- gathered buffer: O(S) K/V memory, one collective (which NCCL runs at bus
-- bandwidth) and nothing to overlap.  This script rewrites the p2p ring loop
-- into that form, in the same block order ((r-s)%R at step s), so both give
-- the same numbers:
--   all_gather group=ring k_cur -> k_all ; all_gather v_cur -> v_all
--   loop count=R { attn q,k_all,v_all block=(r-s)%R ; merge }
-- The send/recv/wait/swap ops and the k_nxt/v_nxt buffers are removed.
-- Works for ring, ring_anything and unified (after the ulysses all-to-all);
-- programs without a p2p ring loop are left as they are.
--
-- Use: cpc --lua lua/examples/allgather.lua PLAN.yaml

local p2p_kinds = {send = true, recv = true, wait = true, swap = true}

function schedule(plan)
  local ops = plan.ops
  for li, loop in ipairs(ops) do
    if loop.kind == "loop" then
      -- the K/V blocks the loop sends: in = {k_cur, v_cur}; it receives into
      -- the recv's out = {k_nxt, v_nxt}
      local send, recv
      for _, o in ipairs(loop.body) do
        if o.kind == "send" and o.group == "ring" then send = o end
        if o.kind == "recv" and o.group == "ring" then recv = o end
      end
      if send and recv then
        local gathered = {}          -- k_cur -> k_all
        local inserts = {}
        for i, name in ipairs(send["in"]) do
          local src = cpc.buffer(plan.buffers, name)
          local all = name:gsub("_cur$", "") .. "_all"
          plan.buffers[#plan.buffers + 1] =
            {name = all, role = src.role, tokens = "all", heads = src.heads, io = "none"}
          gathered[name] = all
          inserts[i] = cpc.op{kind = "all_gather", group = "ring", ["in"] = {name}, out = {all}}
        end
        -- the loop keeps only the compute: attention on block (r-s)%R
        cpc.remove(loop.body, function(o) return p2p_kinds[o.kind] end)
        for _, o in ipairs(loop.body) do
          if o.kind == "attn" then
            for i, name in ipairs(o["in"]) do
              if gathered[name] then o["in"][i] = gathered[name] end
            end
            o.block = "(r-s)%R"
          end
        end
        -- gather right before the loop (after any ulysses all-to-all, which
        -- comes earlier)
        for i = #inserts, 1, -1 do table.insert(ops, li, inserts[i]) end
        -- the next-block buffers are no longer used
        local unused = {}
        for _, name in ipairs(recv.out) do unused[name] = true end
        cpc.remove(plan.buffers, function(b) return unused[b.name] end)
        plan.rotate = "allgather"
        return
      end
    end
  end
end
