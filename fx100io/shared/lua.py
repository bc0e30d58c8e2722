"""The index's atomic scripts.  Every rule about the index lives here, once.

All keys of a pool share one prefix with a hash tag (``fx100io:{name}``),
so each script touches a single Redis Cluster slot.  KEYS[1] is that prefix;
ARGV[1] is the pool's set id, checked against the index's, so a lost or
foreign index is refused (FXLOST) instead of being written to.

Keys under the prefix P:

    P:meta         hash: set_id, ndevs, cap:<d> (capacity per namespace)
    P:ver          counter: versions, one per allocation
    P:idx          hash: key -> "d off ext len crc ver" (published chunks)
    P:at:<d>       zset: key -> last access (ms, Redis clock): LRU order
    P:free:<d>     zset: free extent offsets; P:flen:<d> hash: offset -> length
    P:used         hash: d -> bytes taken (published, leased, in limbo)
    P:lease        zset: "d:off:ext:ver" -> deadline: allocations not yet
                   published; reclaimed once expired (their host died)
    P:pins         zset: "d:off|token" -> deadline: reader pins
    P:pinc         hash: "d:off" -> readers; P:limbo hash: "d:off" -> ext:
                   extents retired while pinned, freed by their last reader
    P:tomb         zset: "d:off:ext" -> deadline: extents of deleted chunks
                   whose deleter is erasing their header (so a rebuild does
                   not bring them back); retired when it is done, or when
                   the deadline passes (it died)
    P:cnt          hash: evictions, reclaimed_leases, expired_pins

An extent leaves the index (delete, eviction, a newer put) by ``retire``:
free at once, or into limbo while a reader holds a pin on it.  Expired
leases and pins are reclaimed by the scripts that allocate and report.
Times come from Redis's clock, so hosts' clocks do not matter.
"""

PRELUDE = r"""
local P = KEYS[1]
local function S(x) return string.format('%.0f', x) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function meta_ok()
  local sid = redis.call('HGET', P .. ':meta', 'set_id')
  return sid ~= false and sid == ARGV[1]
end
local function lost()
  return redis.error_reply('FXLOST the index of this pool is missing or belongs to another '
    .. 'pool (Redis lost its data?): run fx100io shared-rebuild')
end

local function free_extent(d, off, len)
  local fz, fl = P .. ':free:' .. d, P .. ':flen:' .. d
  redis.call('HINCRBY', P .. ':used', d, -len)
  local prev = redis.call('ZREVRANGEBYSCORE', fz, '(' .. S(off), '-inf', 'LIMIT', 0, 1)
  if #prev == 1 then
    local poff = tonumber(prev[1])
    local plen = tonumber(redis.call('HGET', fl, prev[1]))
    if poff + plen == off then
      redis.call('ZREM', fz, prev[1])
      redis.call('HDEL', fl, prev[1])
      off = poff
      len = len + plen
    end
  end
  local nk = S(off + len)
  local nlen = redis.call('HGET', fl, nk)
  if nlen then
    redis.call('ZREM', fz, nk)
    redis.call('HDEL', fl, nk)
    len = len + tonumber(nlen)
  end
  redis.call('ZADD', fz, off, S(off))
  redis.call('HSET', fl, S(off), S(len))
end

local function first_fit(d, need)
  local fz, fl = P .. ':free:' .. d, P .. ':flen:' .. d
  local offs = redis.call('ZRANGE', fz, 0, -1)
  for _, k in ipairs(offs) do
    local len = tonumber(redis.call('HGET', fl, k))
    if len >= need then
      redis.call('ZREM', fz, k)
      redis.call('HDEL', fl, k)
      local off = tonumber(k)
      if len > need then
        redis.call('ZADD', fz, off + need, S(off + need))
        redis.call('HSET', fl, S(off + need), S(len - need))
      end
      return off
    end
  end
  return nil
end

local function retire(d, off, ext)
  local id = d .. ':' .. S(off)
  if tonumber(redis.call('HGET', P .. ':pinc', id) or '0') > 0 then
    redis.call('HSET', P .. ':limbo', id, S(ext))
  else
    free_extent(d, off, ext)
  end
end

local function unpin(member)
  if redis.call('ZREM', P .. ':pins', member) == 0 then return end
  local id = string.match(member, '^([^|]+)|')
  local n = redis.call('HINCRBY', P .. ':pinc', id, -1)
  if n <= 0 then
    redis.call('HDEL', P .. ':pinc', id)
    local ext = redis.call('HGET', P .. ':limbo', id)
    if ext then
      redis.call('HDEL', P .. ':limbo', id)
      local d, off = string.match(id, '^(%d+):(%d+)$')
      free_extent(d, tonumber(off), tonumber(ext))
    end
  end
end

local function reclaim(now)
  local gone = redis.call('ZRANGEBYSCORE', P .. ':lease', '-inf', now, 'LIMIT', 0, 256)
  for _, m in ipairs(gone) do
    redis.call('ZREM', P .. ':lease', m)
    local d, off, ext = string.match(m, '^(%d+):(%d+):(%d+):')
    free_extent(d, tonumber(off), tonumber(ext))
  end
  if #gone > 0 then redis.call('HINCRBY', P .. ':cnt', 'reclaimed_leases', #gone) end
  local tombs = redis.call('ZRANGEBYSCORE', P .. ':tomb', '-inf', now, 'LIMIT', 0, 256)
  for _, m in ipairs(tombs) do
    redis.call('ZREM', P .. ':tomb', m)
    local d, off, ext = string.match(m, '^(%d+):(%d+):(%d+)$')
    retire(d, tonumber(off), tonumber(ext))
  end
  local pins = redis.call('ZRANGEBYSCORE', P .. ':pins', '-inf', now, 'LIMIT', 0, 256)
  for _, m in ipairs(pins) do unpin(m) end
  if #pins > 0 then redis.call('HINCRBY', P .. ':cnt', 'expired_pins', #pins) end
end

local function parse(v)
  local d, off, ext, len, crc, ver = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  return d, tonumber(off), tonumber(ext), tonumber(len), crc, tonumber(ver)
end

local function drop_key(key)
  local v = redis.call('HGET', P .. ':idx', key)
  if not v then return false end
  local d, off, ext = parse(v)
  redis.call('HDEL', P .. ':idx', key)
  redis.call('ZREM', P .. ':at:' .. d, key)
  retire(d, off, ext)
  return true
end
"""

# ARGV: set_id, lease_ms, then (d, ext) per chunk.  Returns {off, ver} per
# chunk, evicting least recently used chunks of the namespace as needed;
# all or nothing (FXFULL undoes this call's allocations).
ALLOC = PRELUDE + r"""
if not meta_ok() then return lost() end
local now = now_ms()
reclaim(now)
local lease_ms = tonumber(ARGV[2])
local MAX_EVICT = 1024
local out, taken = {}, {}
local function undo()
  for _, t in ipairs(taken) do
    redis.call('ZREM', P .. ':lease', t[1])
    free_extent(t[2], t[3], t[4])
  end
end
for i = 3, #ARGV, 2 do
  local d, need = ARGV[i], tonumber(ARGV[i + 1])
  local cap = tonumber(redis.call('HGET', P .. ':meta', 'cap:' .. d) or '-1')
  if cap < 0 then undo() return redis.error_reply('FXBAD no namespace ' .. d) end
  if need > cap then
    undo()
    return redis.error_reply('FXFULL an extent of ' .. S(need) .. ' bytes exceeds the pool '
      .. 'capacity per namespace (' .. S(cap) .. ' bytes)')
  end
  local off, evicted = nil, 0
  while true do
    local used = tonumber(redis.call('HGET', P .. ':used', d) or '0')
    if used + need <= cap then
      off = first_fit(d, need)
      if off then break end
    end
    local v = redis.call('ZRANGE', P .. ':at:' .. d, 0, 0)
    -- bounded: victims being read go to limbo and free nothing yet, and
    -- one put must not empty a namespace that readers hold
    if #v == 0 or evicted >= MAX_EVICT then break end
    drop_key(v[1])
    evicted = evicted + 1
  end
  if evicted > 0 then redis.call('HINCRBY', P .. ':cnt', 'evictions', evicted) end
  if not off then
    undo()
    return redis.error_reply('FXFULL no space for an extent of ' .. S(need) .. ' bytes: the '
      .. 'rest is being written or read')
  end
  redis.call('HINCRBY', P .. ':used', d, need)
  local ver = redis.call('INCR', P .. ':ver')
  local m = d .. ':' .. S(off) .. ':' .. S(need) .. ':' .. S(ver)
  redis.call('ZADD', P .. ':lease', now + lease_ms, m)
  taken[#taken + 1] = {m, d, off, need}
  out[#out + 1] = {S(off), ver}
end
return out
"""

# ARGV: set_id, then (d, off, ext, ver, key, len, crc) per chunk.  Returns
# per chunk 1 (published), 0 (a newer version of the key is already there:
# this one's extent is freed) or -1 (its lease expired and was reclaimed).
PUBLISH = PRELUDE + r"""
if not meta_ok() then return lost() end
local now = now_ms()
local out = {}
for i = 2, #ARGV, 7 do
  local d, off, ext, ver, key, len, crc =
    ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local m = d .. ':' .. off .. ':' .. ext .. ':' .. ver
  if redis.call('ZREM', P .. ':lease', m) == 0 then
    out[#out + 1] = -1
  else
    local old = redis.call('HGET', P .. ':idx', key)
    local oldver = -1
    if old then oldver = select(6, parse(old)) end
    if oldver > tonumber(ver) then
      free_extent(d, tonumber(off), tonumber(ext))
      out[#out + 1] = 0
    else
      if old then drop_key(key) end
      redis.call('HSET', P .. ':idx', key, table.concat({d, off, ext, len, crc, ver}, ' '))
      redis.call('ZADD', P .. ':at:' .. d, now, key)
      out[#out + 1] = 1
    end
  end
end
return out
"""

# ARGV: set_id, lease_ms, lease members ("d:off:ext:ver") of a put being
# written.  Pushes each lease's deadline lease_ms ahead; per lease 1, or 0
# where it is gone (reclaimed after it expired, or aborted): its extent may
# already be another put's, and its writer must write nothing more there.
RENEW = PRELUDE + r"""
local now = now_ms()
local lease_ms = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', P .. ':lease', ARGV[i]) then
    redis.call('ZADD', P .. ':lease', 'XX', now + lease_ms, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# ARGV: set_id, lease members ("d:off:ext:ver") of a put that failed.
ABORT = PRELUDE + r"""
local n = 0
for i = 2, #ARGV do
  if redis.call('ZREM', P .. ':lease', ARGV[i]) == 1 then
    local d, off, ext = string.match(ARGV[i], '^(%d+):(%d+):(%d+):')
    free_extent(d, tonumber(off), tonumber(ext))
    n = n + 1
  end
end
return n
"""

# ARGV: set_id, token, pin_ms, keys...  Returns per key nil or {entry, pin}:
# the extent is pinned (not reused) until the pin is dropped or expires.
GET_BEGIN = PRELUDE + r"""
if not meta_ok() then return lost() end
local now = now_ms()
local pin_ms = tonumber(ARGV[3])
local seq = redis.call('INCR', P .. ':pinseq')
local out = {}
for i = 4, #ARGV do
  local v = redis.call('HGET', P .. ':idx', ARGV[i])
  if v then
    local d, off = parse(v)
    local id = d .. ':' .. S(off)
    local m = id .. '|' .. ARGV[2] .. ':' .. S(seq) .. ':' .. i
    redis.call('ZADD', P .. ':pins', now + pin_ms, m)
    redis.call('HINCRBY', P .. ':pinc', id, 1)
    redis.call('ZADD', P .. ':at:' .. d, now, ARGV[i])
    out[#out + 1] = {v, m}
  else
    out[#out + 1] = false
  end
end
return out
"""

# ARGV: set_id, pins...
GET_END = PRELUDE + r"""
for i = 2, #ARGV do unpin(ARGV[i]) end
return #ARGV - 1
"""

# ARGV: set_id, keys...: how many leading keys are present.
EXISTS = PRELUDE + r"""
if not meta_ok() then return lost() end
for i = 2, #ARGV do
  if redis.call('HEXISTS', P .. ':idx', ARGV[i]) == 0 then return i - 2 end
end
return #ARGV - 1
"""

# ARGV: set_id, key[, ver]: drop the key (only that version, if given).
DROP = PRELUDE + r"""
if not meta_ok() then return lost() end
if ARGV[3] then
  local v = redis.call('HGET', P .. ':idx', ARGV[2])
  if not v or select(6, parse(v)) ~= tonumber(ARGV[3]) then return 0 end
end
if drop_key(ARGV[2]) then return 1 end
return 0
"""

# ARGV: set_id, lease_ms, key: delete the key; its extent is held in
# P:tomb (neither free nor in the index) for lease_ms while the caller
# erases its header.  Returns nil, or {d, off, ext}.
DELETE = PRELUDE + r"""
if not meta_ok() then return lost() end
local v = redis.call('HGET', P .. ':idx', ARGV[3])
if not v then return false end
local d, off, ext = parse(v)
redis.call('HDEL', P .. ':idx', ARGV[3])
redis.call('ZREM', P .. ':at:' .. d, ARGV[3])
redis.call('ZADD', P .. ':tomb', now_ms() + tonumber(ARGV[2]), d .. ':' .. S(off) .. ':' .. S(ext))
return {d, S(off), S(ext)}
"""

# ARGV: set_id, P:tomb members whose header was erased: retire them.
TOMB_DONE = PRELUDE + r"""
local n = 0
for i = 2, #ARGV do
  if redis.call('ZREM', P .. ':tomb', ARGV[i]) == 1 then
    local d, off, ext = string.match(ARGV[i], '^(%d+):(%d+):(%d+)$')
    retire(d, tonumber(off), tonumber(ext))
    n = n + 1
  end
end
return n
"""

# ARGV: set_id.  Reclaims what expired, then reports.
STATS = PRELUDE + r"""
if not meta_ok() then return lost() end
reclaim(now_ms())
local ndevs = tonumber(redis.call('HGET', P .. ':meta', 'ndevs'))
local devs = {}
for d = 0, ndevs - 1 do
  local ds = tostring(d)
  devs[#devs + 1] = {redis.call('HGET', P .. ':used', ds) or '0',
                     redis.call('HGET', P .. ':meta', 'cap:' .. ds) or '0',
                     redis.call('ZCARD', P .. ':at:' .. ds),
                     redis.call('ZCARD', P .. ':free:' .. ds)}
end
return {redis.call('HLEN', P .. ':idx'), devs, redis.call('HGETALL', P .. ':cnt'),
        redis.call('ZCARD', P .. ':lease'), redis.call('ZCARD', P .. ':pins'),
        redis.call('HLEN', P .. ':limbo')}
"""

SCRIPTS = dict(alloc=ALLOC, publish=PUBLISH, abort=ABORT, get_begin=GET_BEGIN,
               get_end=GET_END, renew=RENEW, exists=EXISTS, drop=DROP, delete=DELETE,
               tomb_done=TOMB_DONE, stats=STATS)
