// The Lua scripts of the Redis store (redis-store.ts), one per operation, each atomic across all
// its scopes (Redis runs a script alone). A scope's window is three keys (KEYS in threes):
//   z  a ZSET reservation id → time (ms),   a  a HASH reservation id → tokens,   n  Σ tokens.
// Every script first drops the window's expired entries (time ≤ now − window), each once, from the
// oldest (O(1) amortised), in batches of 1 000 (Lua's unpack limit). Every reserve that admits sets
// PEXPIRE window on the three keys, so an idle scope leaves Redis once its last entry has expired.
// ARGV[1..3]: reservation id, now (ms), window (ms); then per operation below.

const EXPIRE = `
local id, now, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff = now - window
local function expire(z, a, n)
  while true do
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff, 'LIMIT', 0, 1000)
    if #old == 0 then return end
    local amounts = redis.call('HMGET', a, unpack(old))
    local freed = 0
    for i = 1, #amounts do freed = freed + (tonumber(amounts[i]) or 0) end
    redis.call('ZREM', z, unpack(old))
    redis.call('HDEL', a, unpack(old))
    redis.call('DECRBY', n, freed)
    if #old < 1000 then return end
  end
end
`;

/**
 * ARGV[4]: tokens; then per scope: requests limit, tokens limit (0: none). Returns
 * {admitted (0|1), then per scope: count, Σ tokens, newest time (-1: empty), wait for requests,
 * wait for tokens (ms; 0 fits, -1 never)}, the views after the decision; a reservation id already
 * in a window is an error reply.
 */
export const RESERVE_LUA = `${EXPIRE}
local tokens = tonumber(ARGV[4])
local scopes = #KEYS / 3
local function newest(z)
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #top == 0 then return -1 end
  return tonumber(top[2])
end
local function wait_requests(z, count, limit)
  if limit == 0 or count + 1 <= limit then return 0 end
  local at = redis.call('ZRANGE', z, count - limit, count - limit, 'WITHSCORES')
  return tonumber(at[2]) + window - now
end
local function wait_tokens(z, a, total, limit)
  if limit == 0 or total + tokens <= limit then return 0 end
  if tokens > limit then return -1 end
  local to_free, from = total + tokens - limit, 0
  while true do
    local batch = redis.call('ZRANGE', z, from, from + 99, 'WITHSCORES')
    if #batch == 0 then return window end
    local ids = {}
    for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
    local amounts = redis.call('HMGET', a, unpack(ids))
    for i = 1, #ids do
      to_free = to_free - (tonumber(amounts[i]) or 0)
      if to_free <= 0 then return tonumber(batch[2 * i]) + window - now end
    end
    from = from + 100
  end
end
local views, admitted = {}, 1
for s = 0, scopes - 1 do
  local z, a, n = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  expire(z, a, n)
  if redis.call('HEXISTS', a, id) == 1 then return redis.error_reply('ERR reservation ' .. id .. ' is already in a window') end
  local count, total = redis.call('ZCARD', z), tonumber(redis.call('GET', n) or '0')
  local wr = wait_requests(z, count, tonumber(ARGV[5 + 2 * s]))
  local wt = wait_tokens(z, a, total, tonumber(ARGV[6 + 2 * s]))
  if wr ~= 0 or wt ~= 0 then admitted = 0 end
  views[s + 1] = {count, total, newest(z), wr, wt}
end
if admitted == 1 then
  for s = 0, scopes - 1 do
    local z, a, n = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
    redis.call('ZADD', z, now, id)
    redis.call('HSET', a, id, tokens)
    local total = redis.call('INCRBY', n, tokens)
    for _, key in ipairs({z, a, n}) do redis.call('PEXPIRE', key, window) end
    views[s + 1] = {views[s + 1][1] + 1, total, newest(z), 0, 0}
  end
end
local out = {admitted}
for s = 1, scopes do for i = 1, 5 do out[#out + 1] = views[s][i] end end
return out
`;

/** ARGV[4]: tokens. Sets the reservation's tokens where it is in a window; returns nothing. */
export const CORRECT_LUA = `${EXPIRE}
local tokens = tonumber(ARGV[4])
for s = 0, #KEYS / 3 - 1 do
  local z, a, n = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  expire(z, a, n)
  local old = redis.call('HGET', a, id)
  if old then
    redis.call('HSET', a, id, tokens)
    redis.call('INCRBY', n, tokens - tonumber(old))
  end
end
return 0
`;

/** Removes the reservation's entries; returns nothing. */
export const RELEASE_LUA = `${EXPIRE}
for s = 0, #KEYS / 3 - 1 do
  local z, a, n = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  expire(z, a, n)
  local old = redis.call('HGET', a, id)
  if old then
    redis.call('ZREM', z, id)
    redis.call('HDEL', a, id)
    redis.call('DECRBY', n, tonumber(old))
  end
end
return 0
`;
