-- report_to: TensorBoard event files (read back by tests/lua/tb_read.py, an independent reader
-- in Python's standard library), metrics.csv (read back by Python's csv module), and the
-- refusal of services.
local config = require("remax.settings.config")
local runs = require("remax.run.folder")
local tensorboard = require("remax.run.tensorboard")
local cjson = require("cjson")
local support = require("support")
local tmpdir, has_python = support.tmpdir, support.has_python

local function capture(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  local ok = p:close()
  return out, ok
end

local function ls(dir)
  local out = {}
  local p = io.popen("ls '" .. dir .. "' 2>/dev/null")
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

-- Events of every file in a folder, as the Python reader decodes them.
local function read_events(dir)
  local files = {}
  for _, f in ipairs(ls(dir)) do files[#files + 1] = "'" .. dir .. "/" .. f .. "'" end
  local out, ok = capture("python3 tests/lua/tb_read.py " .. table.concat(files, " ") .. " 2>&1")
  assert.is_true(ok == true or ok == 0, "tb_read.py failed: " .. out)
  local events = {}
  for line in out:gmatch("[^\n]+") do events[#events + 1] = cjson.decode(line) end
  return events, #files
end

local function read_csv(path)
  local out, ok = capture(("python3 -c 'import csv, json, sys; print(json.dumps(list(csv.DictReader(open(sys.argv[1])))))' '%s' 2>&1")
    :format(path))
  assert.is_true(ok == true or ok == 0, out)
  return cjson.decode(out)
end

local dir = tmpdir   -- removed when the spec file ends

describe("report_to", function()
  it("computes CRC-32C as the standard check value and TFRecord's mask", function()
    assert.are.equal(0xE3069283, tensorboard.crc32c("123456789"))
    assert.are.equal(0, tensorboard.crc32c(""))
    -- the mask is a rotation plus a constant: undo it and compare
    local c = tensorboard.crc32c("remax")
    local m = tensorboard.masked_crc("remax")
    local rot = (m - 0xa282ead8) % 2 ^ 32
    local back = bit.bor(bit.lshift(rot, 15), bit.rshift(rot, 17))
    assert.are.equal(c, back < 0 and back + 2 ^ 32 or back)
  end)

  it("refuses wandb and other services with the reason, and unknown names", function()
    local ok, err = pcall(config.resolve, { report_to = "wandb" })
    assert.is_false(ok)
    assert.matches("report_to = wandb: Weights & Biases is not supported (the engine has no network dependency)", err, 1, true)
    assert.matches("metrics.jsonl", err, 1, true)
    assert.matches("report_to = tensorboard", err, 1, true)
    ok, err = pcall(config.resolve, {}, config.parse_args({ "--report_to", "tensorboard,tensorbord" }))
    assert.is_false(ok)
    assert.matches("report_to = tensorbord: expected tensorboard, csv, none or all", err, 1, true)
    assert.are.same({ "tensorboard", "csv" }, config.resolve({}, config.parse_args({ "--report_to", "tensorboard,csv" })).report_to)
    assert.are.same({ "none" }, config.resolve({}).report_to)
  end)

  if not has_python() then
    pending("python3 is not installed: the independent readers need it")
    return
  end

  it("writes every step's metrics as TensorBoard scalars and metrics.csv rows", function()
    local trainer = require("remax.run.run")
    local d = support.train_dir(16)
    local cfg = config.resolve(support.run_settings(d, {
      model_config = support.tiny_model(), num_generations = 4, max_completion_length = 8,
      per_device_train_batch_size = 4, learning_rate = 1e-2, max_steps = 3, run_name = "tb", seed = 7, report_to = "all",
    }))
    local t = trainer.new(cfg, { quiet = true, signals = false })
    for _ = 1, 3 do t:train_step() end
    local rows = t.run:metrics()
    assert.are.equal(3, #rows)

    local events, nfiles = read_events(d .. "/runs/tb/tensorboard")
    assert.are.equal(1, nfiles)
    assert.are.equal("brain.Event:2", events[1].file_version)
    local by_step = {}
    for _, e in ipairs(events) do
      if e.step and next(e.scalars) then by_step[e.step] = e end
      assert.is_true(math.abs((e.wall_time or 0) - os.time()) < 3600)
    end
    local checked = 0
    for _, row in ipairs(rows) do
      local e = by_step[row.step]
      assert.is_not_nil(e, "no event at step " .. row.step)
      for k, v in pairs(row) do
        if k ~= "step" and type(v) == "number" and v == v then
          local got = e.scalars[k]
          assert.is_not_nil(got, ("step %d: %s is not in the event"):format(row.step, k))
          assert.is_true(math.abs(got - v) <= 1e-6 * math.max(1, math.abs(v)), ("%s: %s vs %s"):format(k, got, v))
          checked = checked + 1
        end
      end
    end
    assert.is_true(checked > 30)
    assert.is_not_nil(by_step[1].scalars["reward/lower"])

    local csv = read_csv(d .. "/runs/tb/metrics.csv")
    assert.are.equal(#rows, #csv)
    for i, row in ipairs(rows) do
      assert.are.equal(tostring(row.step), csv[i].step)
      for k, v in pairs(row) do
        if type(v) == "number" and v == v then
          assert.is_true(math.abs(tonumber(csv[i][k]) - v) <= 1e-9 * math.max(1, math.abs(v)), k)
        end
      end
    end
  end)

  it("widens metrics.csv when a metric first appears late, and starts a new event file on resume", function()
    local d = dir()
    local run = runs.open(d .. "/r", { report_to = { "csv", "tensorboard" } })
    run:log_metrics(1, { reward = 0.5, loss = 1.25 })
    run:log_metrics(2, { reward = 0.75, loss = 1.0 })
    run:log_metrics(2, { eval_accuracy = 0.3, note = "a, \"quoted\" text" })
    run:close()
    local csv = read_csv(d .. "/r/metrics.csv")
    assert.are.equal(3, #csv)
    assert.are.same({ step = "1", reward = "0.5", loss = "1.25", eval_accuracy = "", note = "" }, csv[1])
    assert.are.same({ step = "2", reward = "", loss = "", eval_accuracy = "0.3", note = "a, \"quoted\" text" }, csv[3])
    -- a resumed run (no checkpoint here: it continues after step 0) keeps metrics.csv equal to
    -- metrics.jsonl and writes a second event file that starts a session at step 1
    local again = runs.open(d .. "/r", { resume = true, report_to = { "csv", "tensorboard" } })
    again:log_metrics(1, { reward = 0.25 })
    again:close()
    csv = read_csv(d .. "/r/metrics.csv")
    assert.are.equal(1, #csv)
    assert.are.equal("0.25", csv[1].reward)
    local events, nfiles = read_events(d .. "/r/tensorboard")
    assert.are.equal(2, nfiles)
    local starts = 0
    for _, e in ipairs(events) do if e.session_start then starts = starts + 1; assert.are.equal(1, e.step) end end
    assert.are.equal(1, starts)
  end)
end)
