"""The index's atomic scripts.  Every rule about the index lives here, once.

All keys of a pool share one prefix with a hash tag (``fx100io:{name}``),
so each script touches a single Redis Cluster slot.  KEYS[1] is that prefix;
ARGV[1] is the pool's set id, checked against the index's, so a lost or
foreign index is refused (FXLOST) instead of being written to.

Keys under the prefix P:

    P:meta         hash: set_id, fmt (2), ndevs, cap:<d> (capacity per namespace);
                   while a create is under way only set_id, fmt "claim",
                   claim_by (the creating host) and claim_until (ms)
    P:ver          counter: versions and access stamps (``stamp``): never
                   below Redis's clock in microseconds, so a counter that a
                   failover or a lost AOF second rolled back resumes above
                   the versions it lost (as long as the clocks agree to
                   within the outage)
    P:idx          hash: key -> "d off ext len crc ver" (published chunks)
    P:at:<d>       zset: key -> stamp of its last access: LRU order, ties
                   impossible (stamps are unique)
    P:free:<d>     zset: free extent offsets (by offset, to merge neighbours);
    P:fsz:<d>      the same extents scored by length (best fit in O(log n));
    P:flen:<d>     hash: offset -> length
    P:used         hash: d -> bytes taken (published, leased, in limbo)
    P:lease        zset: "d:off:ext:ver" -> deadline: allocations not yet
                   published; reclaimed once expired (their host died)
    P:pins         zset: "d:off|token" -> deadline: reader pins
    P:pinc         hash: "d:off" -> readers; P:limbo hash: "d:off" -> ext:
                   extents retired while pinned, freed by their last reader
    P:tomb         zset: "d:off:ext" -> deadline: extents that left the
                   index (a delete, a newer put of the key, an eviction)
                   whose header a host is erasing, so that a rebuild does
                   not bring them back; retired when it is done, or when
                   the deadline passes (it died)
    P:cnt          hash: evictions, reclaimed_leases, expired_pins

An extent leaves the index (delete, eviction, a newer put) into P:tomb,
then, its header erased, by ``retire``: free at once, or into limbo while a
reader holds a pin on it.  No script reads a whole list: free space is
found in O(log n), and a call evicts at most MAX_EVICT chunks.  Expired
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
  local m = redis.call('HMGET', P .. ':meta', 'set_id', 'fmt')
  return m[1] ~= false and m[1] == ARGV[1] and m[2] == '2'
end
local function lost()
  local m = redis.call('HMGET', P .. ':meta', 'set_id', 'fmt')
  if m[2] == 'claim' then
    return redis.error_reply('FXLOST this pool is being created (formatted, its index not yet '
      .. 'installed): retry once the create ended, or create it again')
  end
  if m[1] == ARGV[1] then
    return redis.error_reply('FXLOST the index of this pool was written by an older fx100io: '
      .. 'run fx100io shared-rebuild')
  end
  return redis.error_reply('FXLOST the index of this pool is missing or belongs to another '
    .. 'pool (Redis lost its data, or another pool of the same name replaced it?): run '
    .. 'fx100io shared-rebuild, or give the pools different names')
end
-- a unique, increasing number, never below Redis's clock in microseconds
local function stamp(now)
  local v = redis.call('INCR', P .. ':ver')
  local floor = now * 1000
  if v < floor then
    redis.call('SET', P .. ':ver', S(floor))
    v = floor
  end
  return v
end

local function fadd(d, off, len)
  local k = S(off)
  redis.call('ZADD', P .. ':free:' .. d, off, k)
  redis.call('ZADD', P .. ':fsz:' .. d, len, k)
  redis.call('HSET', P .. ':flen:' .. d, k, S(len))
end
local function fdel(d, k)
  redis.call('ZREM', P .. ':free:' .. d, k)
  redis.call('ZREM', P .. ':fsz:' .. d, k)
  redis.call('HDEL', P .. ':flen:' .. d, k)
end

local function free_extent(d, off, len)
  local fz, fl = P .. ':free:' .. d, P .. ':flen:' .. d
  redis.call('HINCRBY', P .. ':used', d, -len)
  local prev = redis.call('ZREVRANGEBYSCORE', fz, '(' .. S(off), '-inf', 'LIMIT', 0, 1)
  if #prev == 1 then
    local poff = tonumber(prev[1])
    local plen = tonumber(redis.call('HGET', fl, prev[1]))
    if poff + plen == off then
      fdel(d, prev[1])
      off = poff
      len = len + plen
    end
  end
  local nk = S(off + len)
  local nlen = redis.call('HGET', fl, nk)
  if nlen then
    fdel(d, nk)
    len = len + tonumber(nlen)
  end
  fadd(d, off, len)
end

-- best fit: the smallest free extent that holds need bytes, O(log n)
local function fit(d, need)
  local r = redis.call('ZRANGEBYSCORE', P .. ':fsz:' .. d, need, '+inf', 'WITHSCORES',
                      'LIMIT', 0, 1)
  if #r == 0 then return nil end
  local k, len = r[1], tonumber(r[2])
  fdel(d, k)
  local off = tonumber(k)
  if len > need then fadd(d, off + need, len - need) end
  return off
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

-- the key leaves the index; its extent is retired at once (hold == nil:
-- its data is known bad) or held in P:tomb until hold (a deadline) while
-- a host erases its header.  Returns the tomb member, true, or false.
local function drop_key(key, hold)
  local v = redis.call('HGET', P .. ':idx', key)
  if not v then return false end
  local d, off, ext = parse(v)
  redis.call('HDEL', P .. ':idx', key)
  redis.call('ZREM', P .. ':at:' .. d, key)
  if hold == nil then
    retire(d, off, ext)
    return true
  end
  local m = d .. ':' .. S(off) .. ':' .. S(ext)
  redis.call('ZADD', P .. ':tomb', hold, m)
  return m
end
"""

# ARGV: set_id, lease_ms, then (d, ext) per chunk.  Returns {1, {{off,
# ver}, ...}}, or {0, tombs}: least recently used chunks were evicted to
# make room, and their extents (tomb members "d:off:ext") are held until
# the caller erased their headers and called TOMB_DONE, then calls again.
# {1, allocations, tombs}: allocated, and the caller erases the headers of
# chunks evicted on the way (held apart from its allocations) too.
# All or nothing (FXFULL or {0, ...} undoes this call's allocations); the
# chunks it evicted stay evicted.
ALLOC = PRELUDE + r"""
if not meta_ok() then return lost() end
local now = now_ms()
reclaim(now)
local lease_ms = tonumber(ARGV[2])
local MAX_EVICT = 256
local out, taken, tombs, pend = {}, {}, {}, {}
local evicted = 0
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
  local off = nil
  while true do
    local used = tonumber(redis.call('HGET', P .. ':used', d) or '0')
    local p = pend[d] or 0
    -- under capacity once what this call evicted is freed
    if used - p + need <= cap then
      off = fit(d, need)
      if off then break end
      -- no free extent fits yet: enough is being erased to make room?
      if p >= need then break end
    end
    local v = redis.call('ZRANGE', P .. ':at:' .. d, 0, 0)
    -- bounded: one call does O(MAX_EVICT log n) work, whatever the pool
    if #v == 0 or evicted >= MAX_EVICT then break end
    local m = drop_key(v[1], now + lease_ms)
    tombs[#tombs + 1] = m
    pend[d] = p + tonumber(string.match(m, ':(%d+)$'))
    evicted = evicted + 1
  end
  if not off then
    undo()
    if evicted > 0 then
      redis.call('HINCRBY', P .. ':cnt', 'evictions', evicted)
      return {0, tombs}
    end
    return redis.error_reply('FXFULL no space for an extent of ' .. S(need) .. ' bytes: the '
      .. 'rest is being written or read')
  end
  redis.call('HINCRBY', P .. ':used', d, need)
  local ver = stamp(now)
  local m = d .. ':' .. S(off) .. ':' .. S(need) .. ':' .. S(ver)
  redis.call('ZADD', P .. ':lease', now + lease_ms, m)
  taken[#taken + 1] = {m, d, off, need}
  out[#out + 1] = {S(off), S(ver)}
end
if evicted > 0 then redis.call('HINCRBY', P .. ':cnt', 'evictions', evicted) end
-- room was found without waiting for the evicted: their extents stay held
-- (apart from the ones allocated) while the caller erases their headers
return {1, out, tombs}
"""

# ARGV: set_id, hold_ms, then (d, off, ext, ver, key, len, crc) per chunk.
# Returns {codes, tombs}: per chunk 1 (published), 0 (a newer version of
# the key is already there) or -1 (its lease expired and was reclaimed);
# tombs: the extents that left the index (the keys' older versions, the
# superseded), held for hold_ms while the caller erases their headers.
PUBLISH = PRELUDE + r"""
if not meta_ok() then return lost() end
local now = now_ms()
local hold = now + tonumber(ARGV[2])
local out, tombs = {}, {}
for i = 3, #ARGV, 7 do
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
      local m = d .. ':' .. off .. ':' .. ext
      redis.call('ZADD', P .. ':tomb', hold, m)
      tombs[#tombs + 1] = m
      out[#out + 1] = 0
    else
      if old then tombs[#tombs + 1] = drop_key(key, hold) end
      redis.call('HSET', P .. ':idx', key, table.concat({d, off, ext, len, crc, ver}, ' '))
      redis.call('ZADD', P .. ':at:' .. d, stamp(now), key)
      out[#out + 1] = 1
    end
  end
end
return {out, tombs}
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
    redis.call('ZADD', P .. ':at:' .. d, stamp(now), ARGV[i])
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
local m = drop_key(ARGV[3], now_ms() + tonumber(ARGV[2]))
if not m then return false end
local d, off, ext = string.match(m, '^(%d+):(%d+):(%d+)$')
return {d, off, ext}
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

# ARGV: set_id (the new pool's), host, claim_ms, force (0/1).  Claims the
# pool's name before a create writes any byte: P:meta becomes {set_id, fmt
# "claim", claim_by, claim_until}.  Granted where Redis holds nothing under
# the name, or a claim whose deadline passed (that create died; the
# namespaces it formatted may be formatted again), and, with force, over
# anything.  Refused (FXLIVE) over a pool's index, and (FXBUSY) over a
# claim whose deadline has not passed: that create may still be writing
# superblocks (it renews its claim before each one, see CLAIM_RENEW), even
# where the namespaces already carry its set id.  Returns the previous
# P:meta (a flat list), which UNCLAIM puts back should the create be
# refused after all.
CLAIM = PRELUDE + r"""
local now = now_ms()
local prev = redis.call('HGETALL', P .. ':meta')
local m = {}
for i = 1, #prev, 2 do m[prev[i]] = prev[i + 1] end
local force = ARGV[4] == '1'
if m.set_id and not force then
  if m.fmt ~= 'claim' then
    return redis.error_reply('FXLIVE Redis already holds the index of a pool of this name '
      .. '(set id ' .. m.set_id .. '): refusing to create it again; pass another name, or '
      .. 'force=True to wipe that pool')
  end
  local left = tonumber(m.claim_until or '0') - now
  if left > 0 then
    return redis.error_reply('FXBUSY this pool is being created by ' .. (m.claim_by or '?')
      .. ' (its claim ends in ' .. S(left) .. ' ms unless that create completes)')
  end
end
redis.call('DEL', P .. ':meta')
redis.call('HSET', P .. ':meta', 'set_id', ARGV[1], 'fmt', 'claim', 'claim_by', ARGV[2],
           'claim_until', S(now + tonumber(ARGV[3])))
return prev
"""

# ARGV: set_id, claim_ms.  A create renews its claim before each superblock
# it writes: claim_until moves claim_ms ahead.  Returns 0 where the claim is
# no longer this create's (taken over with force, or after its deadline):
# the create must then write nothing more.
CLAIM_RENEW = PRELUDE + r"""
local m = redis.call('HMGET', P .. ':meta', 'set_id', 'fmt')
if m[1] ~= ARGV[1] or m[2] ~= 'claim' then return 0 end
redis.call('HSET', P .. ':meta', 'claim_until', S(now_ms() + tonumber(ARGV[2])))
return 1
"""

# ARGV: set_id, then the flat P:meta that CLAIM returned.  A create that is
# refused after its claim (before writing any byte) gives the name back:
# P:meta is as it was, if the claim is still this create's.
UNCLAIM = PRELUDE + r"""
local m = redis.call('HMGET', P .. ':meta', 'set_id', 'fmt')
if m[1] ~= ARGV[1] or m[2] ~= 'claim' then return 0 end
redis.call('DEL', P .. ':meta')
if #ARGV > 1 then redis.call('HSET', P .. ':meta', unpack(ARGV, 2)) end
return 1
"""

SCRIPTS = dict(alloc=ALLOC, publish=PUBLISH, abort=ABORT, get_begin=GET_BEGIN,
               get_end=GET_END, renew=RENEW, exists=EXISTS, drop=DROP, delete=DELETE,
               tomb_done=TOMB_DONE, stats=STATS, claim=CLAIM, claim_renew=CLAIM_RENEW,
               unclaim=UNCLAIM)
