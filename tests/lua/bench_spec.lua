-- bench_spec: the GPU window's whole-step benchmark (bench/gpu_remax_step.sh, through
-- bench/remax_step.lua and bench/gpu_common.sh) runs at a tiny shape, so that it cannot rot
-- between GPU windows: on device cuda where the library has it (the CUDA emulator's build in CI:
-- `./remax test` runs the specs named cuda against it), else on the CPU. It measures nothing.
local cjson = require("cjson")
local support = require("support")

local q = support.shell_quote

local binary = support.remax_binary

describe("bench/gpu_remax_step.sh", function()
  it("cuda (else cpu): --tiny runs one ReMax step and prints its phases and a summary", function()
    local device = require("remax.bind.tensor").has_cuda() and "cuda" or "cpu"
    local err_file = support.tmpfile()
    local p = io.popen(("REMAX_BIN=%s DEVICE=%s bash bench/gpu_remax_step.sh --tiny 2>%s; echo \"rc=$?\""):format(
      q(binary()), device, q(err_file)))
    local out = p:read("*a")
    p:close()
    local f = io.open(err_file)
    local err = f and f:read("*a") or ""
    if f then f:close() end
    assert.are.equal("0", out:match("rc=(%d+)%s*$"), out .. err)
    local line = out:match("\n(%{[^\n]*\"bench\":\"remax_step\"[^\n]*%})\n")
    assert.is_truthy(line, out .. err)
    local r = cjson.decode(line)
    assert.are.equal(device, r.device)
    assert.are.equal(4 * (2 + 1), r.rows)   -- prompts x (samples + greedy)
    assert.is_true(r.tokens_generated > 0 and r.tokens_generated <= r.rows * 8)
    for _, k in ipairs({ "generate_s", "score_s", "ref_logprobs_s", "update_s" }) do
      assert.is_true(r[k] > 0, k .. " = " .. tostring(r[k]))
    end
    -- the phases make up the step (what lies between them is bookkeeping)
    local parts = r.generate_s + r.score_s + r.ref_logprobs_s + r.update_s
    assert.is_true(parts <= r.step_s + 1e-6 and parts >= 0.9 * r.step_s, ("%g of %g"):format(parts, r.step_s))
    assert.is_truthy(out:find("\n| remax_step tiny f32 on " .. device .. ", 12 rows x 8 new tokens: step ", 1, true), out)
  end)
end)
