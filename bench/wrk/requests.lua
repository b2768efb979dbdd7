-- wrk script for bench/bench_ceiling.py: replays pre-built requests and prints a JSON summary.
--
-- WRK_METHOD   request method (POST for checks, GET for forward auth)
-- WRK_PATH     request path
-- WRK_BODIES   file with one request body per line (optional: no body when unset)
-- WRK_HEADERS  extra headers, "Name: value" separated by "\n" (Authorization, X-Forwarded-*)
-- WRK_PIPELINE requests per write, HTTP/1.1 pipelining (optional, default 1: one at a time)
-- Every request is formatted once at start-up; each connection cycles through them from its own
-- offset, so the script costs wrk a table lookup per request.
--
-- With WRK_PIPELINE=N > 1 (wrk's pipeline.lua pattern), the requests are concatenated N at a time
-- at start-up, in their order (the last group wraps around to the first requests), and each
-- write sends one such group: wrk counts the requests in the first group (its "pipeline" depth),
-- writes the next group when all N answers are in, and records each answer's latency from the
-- group's write. Every group holds N requests, so the depth wrk counted holds for every write.

local reqs = {}
local n = 0
local i = 0

local function build()
  local headers = {}
  for line in string.gmatch(os.getenv("WRK_HEADERS") or "", "[^\n]+") do
    local name, value = string.match(line, "^([^:]+):%s*(.*)$")
    if name then headers[name] = value end
  end
  local method, path = os.getenv("WRK_METHOD") or "GET", os.getenv("WRK_PATH") or "/"
  local file = os.getenv("WRK_BODIES")
  if file and file ~= "" then
    headers["Content-Type"] = "application/json"
    for body in io.lines(file) do
      if body ~= "" then
        n = n + 1
        reqs[n] = wrk.format(method, path, headers, body)
      end
    end
  else
    n = 1
    reqs[1] = wrk.format(method, path, headers)
  end
end

local function pipeline(depth)
  if depth <= 1 then return end
  local groups, count = {}, math.ceil(n / depth)
  for g = 1, count do
    local parts = {}
    for k = 1, depth do
      parts[k] = reqs[((g - 1) * depth + k - 1) % n + 1]
    end
    groups[g] = table.concat(parts)
  end
  reqs, n = groups, count
end

init = function(args)
  build()
  pipeline(tonumber(os.getenv("WRK_PIPELINE") or "1") or 1)
  i = math.random(n) - 1
end

request = function()
  i = i % n + 1
  return reqs[i]
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"status_errors":%d,"timeouts":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
