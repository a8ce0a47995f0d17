-- The Store contract (docs/store.md, LangGraph's BaseStore) as a reusable
-- set of busted specs. A backend's spec runs it with a factory:
--
--   require("store_contract")("postgres", function(opts) return ctx end, _ENV)
--
-- make(opts) returns { store = s, age = fn(seconds), close = fn } for an
-- EMPTY store built with opts (index, ttl): age makes that much time pass
-- for the store's TTLs and timestamps, close releases it.
-- Each `it` names the LangGraph reference page whose behaviour it checks.
local mg = require "moongraph"

local BASE = "https://reference.langchain.com/python/langgraph.store/base/"

-- A deterministic embedding: counts of a few words, in this order.
local VOCAB = { "cat", "dog", "fish", "bird", "tree", "car", "road", "sea" }
local function embed(texts)
  local out = {}
  for i, t in ipairs(texts) do
    local v = {}
    for j, w in ipairs(VOCAB) do
      local n = 0
      for _ in t:lower():gmatch("%f[%a]" .. w .. "s?%f[%A]") do n = n + 1 end
      v[j] = n
    end
    out[i] = v
  end
  return out
end

local function keys_of(items)
  local out = {}
  for i, it in ipairs(items) do out[i] = it.key end
  return out
end

local function joined(list)
  local out = {}
  for i, ns in ipairs(list) do out[i] = table.concat(ns, "|") end
  return out
end

return function(name, make, env)
  local describe, it, assert = env.describe, env.it, env.assert
  describe(name .. " store", function()
    local function with_store(opts, fn)
      if fn == nil then fn, opts = opts, nil end
      return mg.run(function()
        local ctx = make(opts)
        local ok, err = pcall(fn, ctx.store, ctx)
        ctx.close()
        if not ok then error(err, 0) end
      end)
    end

    describe("items", function()
      -- BASE .. "BaseStore" (put / get), "Item"
      it("put then get returns the item with its namespace, key, value and times", function()
        with_store(function(s)
          assert.is_true(s:put({ "users", "u1" }, "prefs", { theme = "dark", n = 2, f = 2.5 }))
          local item = assert(s:get({ "users", "u1" }, "prefs"))
          assert.same({ "users", "u1" }, item.namespace)
          assert.equal("prefs", item.key)
          assert.same({ theme = "dark", n = 2, f = 2.5 }, item.value)
          assert.equal("integer", math.type(item.value.n))
          assert.equal("number", type(item.created_at))
          assert.equal(item.created_at, item.updated_at)
          assert.is_nil(item.score)
        end)
      end)

      it("keeps integers integers and floats floats, whole floats of any size too", function()
        with_store(function(s)
          local value = { i = 1000000000000000, big = math.maxinteger, f = 1e15, g = -1.5e17, h = 2.0 ^ 62,
                          h63 = 2.0 ^ 63, m63 = -(2.0 ^ 63), k = 3.0, tiny = 1e-7, huge = 1e300 }
          assert(s:put({ "nums" }, "k", value))
          local got = assert(s:get({ "nums" }, "k")).value
          for k, v in pairs(value) do
            assert.equal(v, got[k], k)
            assert.equal(math.type(v), math.type(got[k]), k)
          end
        end)
      end)

      -- BASE .. "BaseStore" (get: "The retrieved item or None if not found")
      it("get of a missing key or namespace returns nil without an error", function()
        with_store(function(s)
          assert(s:put({ "a" }, "k", { x = 1 }))
          local item, err = s:get({ "a" }, "other")
          assert.is_nil(item)
          assert.is_nil(err)
          item, err = s:get({ "b" }, "k")
          assert.is_nil(item)
          assert.is_nil(err)
        end)
      end)

      -- BASE .. "BaseStore" (put updates; Item.created_at / updated_at)
      it("put on an existing key replaces the value and keeps created_at", function()
        with_store(function(s, ctx)
          assert(s:put({ "a" }, "k", { v = 1, gone = true }))
          local first = assert(s:get({ "a" }, "k"))
          ctx.age(2)
          assert(s:put({ "a" }, "k", { v = 2 }))
          local second = assert(s:get({ "a" }, "k"))
          assert.same({ v = 2 }, second.value)
          assert.equal(first.created_at, first.updated_at)
          -- two seconds between the writes (age() moves the clock, or the rows, by that much)
          assert.near(2, second.updated_at - second.created_at, 0.5)
        end)
      end)

      -- BASE .. "BaseStore" (delete) and PutOp.value ("None to mark the item for deletion")
      it("delete and a put of nil remove the item", function()
        with_store(function(s)
          assert(s:put({ "a" }, "k1", { v = 1 }))
          assert(s:put({ "a" }, "k2", { v = 2 }))
          assert.is_true(s:delete({ "a" }, "k1"))
          assert.is_nil(s:get({ "a" }, "k1"))
          assert.is_true(s:put({ "a" }, "k2", nil))
          assert.is_nil(s:get({ "a" }, "k2"))
          assert.is_true(s:delete({ "a" }, "never-there"))
          assert.same({}, s:list_namespaces())
        end)
      end)

      it("values come back as copies: changing one changes neither the store nor other readers", function()
        with_store(function(s)
          local v = { list = { 1, 2 }, nested = { x = "y" } }
          assert(s:put({ "a" }, "k", v))
          v.list[1] = 99
          local got = assert(s:get({ "a" }, "k"))
          assert.same({ list = { 1, 2 }, nested = { x = "y" } }, got.value)
          got.value.nested.x = "changed"
          assert.equal("y", assert(s:get({ "a" }, "k")).value.nested.x)
        end)
      end)

      -- BASE .. "PutOp" (namespace: "Hierarchical path"); moongraph keeps any label verbatim
      it("namespaces and keys with quotes, dots, slashes, wildcards and non-ASCII round-trip verbatim", function()
        with_store(function(s)
          local odd = {
            { { "it's", 'say "hi"' }, "o'clock" },
            { { "a.b", "c.d.e" }, "x.y" },
            { { "path/to", "\\back\\" }, "/k/" },
            { { "사용자", "😀 emoji" }, "키" },
            { { "*", "%_like" }, "%" },
            { { "tab\there", "\1ctl" }, "new\nline" },
            { { "a", "b" }, "" },
          }
          for i, c in ipairs(odd) do
            assert.is_true(s:put(c[1], c[2], { i = i }))
          end
          for i, c in ipairs(odd) do
            local item = assert(s:get(c[1], c[2]), "missing item " .. i)
            assert.same(c[1], item.namespace)
            assert.equal(c[2], item.key)
            assert.equal(i, item.value.i)
            local found = assert(s:search(c[1]))
            assert.equal(1, #found, "search by its own namespace finds item " .. i)
            assert.same(c[1], found[1].namespace)
            assert.equal(c[2], found[1].key)
          end
          local all = joined(assert(s:list_namespaces()))
          -- sorted as lists of labels, byte by byte
          local want = {}
          for i, c in ipairs(odd) do want[i] = c[1] end
          table.sort(want, function(a, b) return table.concat(a, "\0") < table.concat(b, "\0") end)
          assert.same(joined(want), all)
        end)
      end)

      it("values keep non-ASCII text, empty lists, nested tables and JSON null", function()
        with_store(function(s)
          local json = require "moongraph.json"
          local v = { text = "분리수거 — 'quotes' \"and\" \\", empty = json.array {}, deep = { a = { b = { 1, 2.5, "3" } } },
            flag = false, none = json.null }
          assert(s:put({ "a" }, "k", v))
          local got = assert(s:get({ "a" }, "k")).value
          assert.same(v, got)
          assert.is_true(json.is_array(got.empty))
          assert.equal(json.null, got.none)
        end)
      end)
    end)

    describe("search", function()
      local function fill(s)
        assert(s:put({ "docs", "u1" }, "a", { kind = "report", score = 3, title = "alpha", tags = { "x" } }))
        assert(s:put({ "docs", "u1" }, "b", { kind = "note", score = 5.5, title = "beta" }))
        assert(s:put({ "docs", "u2" }, "c", { kind = "report", score = 7, title = "gamma" }))
        assert(s:put({ "docs2" }, "d", { kind = "report", score = 9, title = "delta" }))
        assert(s:put({ "docs.u1" }, "e", { kind = "report", score = 1, title = "eps" }))
      end

      -- BASE .. "SearchOp" (namespace_prefix)
      it("finds items under a namespace prefix, label by label", function()
        with_store(function(s)
          fill(s)
          local keys = keys_of(assert(s:search({ "docs" })))
          table.sort(keys)
          assert.same({ "a", "b", "c" }, keys)
          keys = keys_of(assert(s:search({ "docs", "u1" })))
          table.sort(keys)
          assert.same({ "a", "b" }, keys)
          assert.same({}, assert(s:search({ "doc" })))
          assert.same({}, assert(s:search({ "docs", "u1", "deeper" })))
          assert.equal(5, #assert(s:search({})))
          assert.equal(5, #assert(s:search()))
        end)
      end)

      -- LangGraph's PostgresStore orders a search without a query by updated_at, newest first
      it("returns the most recently updated first, paged by limit and offset", function()
        with_store(function(s, ctx)
          for i = 1, 12 do
            assert(s:put({ "p" }, string.format("k%02d", i), { i = i }))
            ctx.age(1)
          end
          local page1 = keys_of(assert(s:search({ "p" })))
          assert.equal(10, #page1)               -- limit defaults to 10
          assert.equal("k12", page1[1])
          assert.equal("k03", page1[10])
          assert.same({ "k10", "k09" }, keys_of(assert(s:search({ "p" }, { limit = 2, offset = 2 }))))
          assert.same({ "k02", "k01" }, keys_of(assert(s:search({ "p" }, { limit = 5, offset = 10 }))))
          assert.same({}, assert(s:search({ "p" }, { offset = 50 })))
        end)
      end)

      -- BASE .. "SearchOp" (filter: exact matches)
      it("filters on equality of value fields, all conditions together", function()
        with_store(function(s)
          fill(s)
          local keys = keys_of(assert(s:search({ "docs" }, { filter = { kind = "report" } })))
          table.sort(keys)
          assert.same({ "a", "c" }, keys)
          assert.same({ "c" }, keys_of(assert(s:search({}, { filter = { kind = "report", title = "gamma" } }))))
          assert.same({ "a" }, keys_of(assert(s:search({}, { filter = { tags = { "x" } } }))))
          assert.same({}, assert(s:search({}, { filter = { kind = "nothing" } })))
          assert.same({ "b" }, keys_of(assert(s:search({}, { filter = { score = 5.5 } }))))
          -- numbers compare by value: 7 matches 7.0
          assert.same({ "c" }, keys_of(assert(s:search({}, { filter = { score = 7.0 } }))))
        end)
      end)

      -- BASE .. "SearchOp" (filter: $eq, $ne, $gt, $gte, $lt, $lte)
      it("filters with the comparison operators", function()
        with_store(function(s)
          fill(s)
          local function q(filter)
            local keys = keys_of(assert(s:search({}, { filter = filter })))
            table.sort(keys)
            return keys
          end
          assert.same({ "c", "d" }, q { score = { ["$gt"] = 5.5 } })
          assert.same({ "b", "c", "d" }, q { score = { ["$gte"] = 5.5 } })
          assert.same({ "a", "e" }, q { score = { ["$lt"] = 5.5 } })
          assert.same({ "a", "b", "e" }, q { score = { ["$lte"] = 5.5 } })
          assert.same({ "a", "b" }, q { score = { ["$gte"] = 3, ["$lt"] = 7 } })
          assert.same({ "b" }, q { kind = { ["$ne"] = "report" } })
          assert.same({ "c" }, q { kind = { ["$eq"] = "report" }, score = { ["$gt"] = 5, ["$lt"] = 8 } })
          -- strings compare byte by byte
          assert.same({ "a", "b", "d" }, q { title = { ["$lt"] = "e" } })
          assert.same({ "c" }, q { title = { ["$gte"] = "gamma" } })
          -- a number never compares with a string, nor a missing field
          assert.same({}, q { title = { ["$gt"] = 0 } })
          assert.same({}, q { score = { ["$gt"] = "a" } })
          assert.same({}, q { missing = { ["$gt"] = 0 } })
          -- $ne matches items without the field
          assert.same({ "b", "c", "d", "e" }, q { tags = { ["$ne"] = { "x" } } })
        end)
      end)
    end)

    describe("list_namespaces", function()
      local function fill(s)
        for _, ns in ipairs {
          { "a", "b", "c" }, { "a", "b", "d", "e" }, { "a", "b", "d", "i" }, { "a", "b", "f" },
          { "a", "c", "f" }, { "x", "v1" }, { "y", "cache", "v1" },
        } do
          assert(s:put(ns, "k", { x = 1 }))
        end
      end

      -- BASE .. "BaseStore" (list_namespaces, its max_depth example)
      it("lists namespaces sorted, truncated to max_depth and deduplicated", function()
        with_store(function(s)
          fill(s)
          assert.same({ "a|b|c", "a|b|d", "a|b|f" },
            joined(assert(s:list_namespaces { prefix = { "a", "b" }, max_depth = 3 })))
          assert.same({ "a", "x", "y" }, joined(assert(s:list_namespaces { max_depth = 1 })))
          assert.equal(7, #assert(s:list_namespaces()))
        end)
      end)

      -- BASE .. "MatchCondition" (prefix / suffix, "*" wildcards)
      it("matches prefixes and suffixes with * wildcards", function()
        with_store(function(s)
          fill(s)
          assert.same({ "x|v1", "y|cache|v1" }, joined(assert(s:list_namespaces { suffix = { "v1" } })))
          assert.same({ "a|b|f", "a|c|f" }, joined(assert(s:list_namespaces { prefix = { "a", "*", "f" } })))
          assert.same({ "y|cache|v1" }, joined(assert(s:list_namespaces { suffix = { "cache", "*" } })))
          assert.same({ "a|c|f" }, joined(assert(s:list_namespaces { prefix = { "a" }, suffix = { "c", "f" } })))
          assert.same({}, joined(assert(s:list_namespaces { prefix = { "z" } })))
        end)
      end)

      -- BASE .. "ListNamespacesOp" (limit = 100, offset = 0)
      it("pages with limit and offset", function()
        with_store(function(s)
          fill(s)
          assert.same({ "a|b|d|e", "a|b|d|i" }, joined(assert(s:list_namespaces { limit = 2, offset = 1 })))
          assert.same({}, assert(s:list_namespaces { offset = 7 }))
        end)
      end)
    end)

    describe("batch", function()
      -- BASE .. "BaseStore" (batch: "The order of results matches the order of input operations")
      it("runs gets, puts, deletes, searches and listings together, results in order", function()
        with_store(function(s)
          assert(s:put({ "a" }, "old", { v = 0 }))
          assert(s:put({ "a" }, "drop", { v = 9 }))
          local res = assert(s:batch {
            { op = "put", namespace = { "a" }, key = "new", value = { v = 1 } },
            { op = "get", namespace = { "a" }, key = "old" },
            { op = "get", namespace = { "a" }, key = "missing" },
            { op = "delete", namespace = { "a" }, key = "drop" },
            { op = "search", namespace_prefix = { "a" }, filter = { v = 0 } },
            { op = "list_namespaces" },
          })
          assert.equal(6, res.n)
          assert.is_true(res[1])
          assert.equal("old", res[2].key)
          assert.is_nil(res[3])
          assert.is_true(res[4])
          assert.same({ "old" }, keys_of(res[5]))
          assert.same({ "a" }, joined(res[6]))
          assert.same({ v = 1 }, assert(s:get({ "a" }, "new")).value)
          assert.is_nil(s:get({ "a" }, "drop"))
        end)
      end)

      -- LangGraph's stores read before they write within a batch, and keep the last put of a key
      it("reads see the store as before the batch; the last write to a key wins", function()
        with_store(function(s)
          assert(s:put({ "a" }, "k", { v = "before" }))
          local res = assert(s:batch {
            { op = "put", namespace = { "a" }, key = "k", value = { v = "first" } },
            { op = "get", namespace = { "a" }, key = "k" },
            { op = "put", namespace = { "a" }, key = "k", value = { v = "second" } },
            { op = "put", namespace = { "a" }, key = "gone", value = { v = 1 } },
            { op = "delete", namespace = { "a" }, key = "gone" },
          })
          assert.equal("before", res[2].value.v)
          assert.equal("second", assert(s:get({ "a" }, "k")).value.v)
          assert.is_nil(s:get({ "a" }, "gone"))
        end)
      end)

      it("an empty batch returns no results", function()
        with_store(function(s)
          assert.same({ n = 0 }, assert(s:batch {}))
        end)
      end)
    end)

    describe("TTL", function()
      -- BASE .. "PutOp/ttl" (minutes; expires that long after last access)
      it("an item expires ttl minutes after it was written: invisible to get, search and listings", function()
        with_store(function(s, ctx)
          assert(s:put({ "t" }, "short", { v = 1 }, { ttl = 1 }))
          assert(s:put({ "t" }, "long", { v = 2 }, { ttl = 10 }))
          assert(s:put({ "u" }, "gone", { v = 3 }, { ttl = 0.5 }))
          ctx.age(50)
          assert.truthy(s:get({ "t" }, "short", { refresh_ttl = false }))
          ctx.age(20)
          assert.is_nil(s:get({ "t" }, "short"))
          assert.is_nil(s:get({ "u" }, "gone"))
          assert.same({ "long" }, keys_of(assert(s:search({}))))
          assert.same({ "t" }, joined(assert(s:list_namespaces())))
        end)
      end)

      -- BASE .. "TTLConfig/refresh_on_read", "GetOp/refresh_ttl", "SearchOp" (refresh_ttl)
      it("get and search refresh the TTL unless refresh_ttl = false", function()
        with_store(function(s, ctx)
          assert(s:put({ "t" }, "got", { v = 1 }, { ttl = 1 }))
          assert(s:put({ "t" }, "found", { v = 2 }, { ttl = 1 }))
          assert(s:put({ "t" }, "peeked", { v = 3 }, { ttl = 1 }))
          for round = 1, 3 do
            ctx.age(40)
            assert.truthy(s:get({ "t" }, "got"))
            assert.equal(1, #assert(s:search({ "t" }, { filter = { v = 2 } })))
            if round == 1 then assert.truthy(s:get({ "t" }, "peeked", { refresh_ttl = false })) end
          end
          -- 120 s since the writes: only the refreshed items remain
          assert.truthy(s:get({ "t" }, "got"))
          assert.truthy(s:get({ "t" }, "found"))
          assert.is_nil(s:get({ "t" }, "peeked"))
        end)
      end)

      -- BASE .. "TTLConfig/default_ttl" and refresh_on_read = false
      it("the store's default_ttl applies to puts without ttl; ttl = false never expires", function()
        with_store({ ttl = { default_ttl = 1, refresh_on_read = false } }, function(s, ctx)
          assert(s:put({ "t" }, "default", { v = 1 }))
          assert(s:put({ "t" }, "forever", { v = 2 }, { ttl = false }))
          assert(s:put({ "t" }, "explicit", { v = 3 }, { ttl = 5 }))
          ctx.age(40)
          assert.truthy(s:get({ "t" }, "default"))     -- does not refresh: refresh_on_read = false
          ctx.age(40)
          assert.is_nil(s:get({ "t" }, "default"))
          assert.truthy(s:get({ "t" }, "forever"))
          assert.truthy(s:get({ "t" }, "explicit"))
        end)
      end)

      it("a put on an expired key starts a new item", function()
        with_store(function(s, ctx)
          assert(s:put({ "t" }, "k", { v = 1 }, { ttl = 1 }))
          ctx.age(120)
          assert(s:put({ "t" }, "k", { v = 2 }))
          local item = assert(s:get({ "t" }, "k"))
          assert.equal(2, item.value.v)
          assert.equal(item.created_at, item.updated_at)
        end)
      end)

      -- LangGraph's PostgresStore.sweep_ttl: "Delete expired store items based on TTL"
      it("sweep removes expired items and says how many", function()
        with_store(function(s, ctx)
          assert(s:put({ "t" }, "a", { v = 1 }, { ttl = 1 }))
          assert(s:put({ "t" }, "b", { v = 1 }, { ttl = 1 }))
          assert(s:put({ "t" }, "c", { v = 1 }))
          ctx.age(61)
          assert.equal(2, s:sweep())
          assert.equal(0, s:sweep())
          assert.same({ "c" }, keys_of(assert(s:search({}))))
        end)
      end)
    end)

    describe("semantic search", function()
      local INDEX = { embed = embed, dims = #VOCAB, fields = { "text" } }

      -- BASE .. "IndexConfig" (embed, dims, fields) and SearchItem.score
      it("ranks items by cosine similarity to the query, with a score", function()
        with_store({ index = INDEX }, function(s)
          assert(s:put({ "m" }, "pets", { text = "my cat and my dog" }))
          assert(s:put({ "m" }, "cat", { text = "a cat" }))
          assert(s:put({ "m" }, "sea", { text = "the sea and a fish" }))
          local found = assert(s:search({ "m" }, { query = "cat" }))
          assert.same({ "cat", "pets", "sea" }, keys_of(found))
          assert.near(1.0, found[1].score, 1e-9)
          assert.near(1 / math.sqrt(2), found[2].score, 1e-9)
          assert.near(0.0, found[3].score, 1e-9)
          found = assert(s:search({ "m" }, { query = "fish in the sea", limit = 1 }))
          assert.same({ "sea" }, keys_of(found))
          assert.near(1.0, found[1].score, 1e-9)
        end)
      end)

      -- BASE .. "IndexConfig" (fields: "Fields missing from a document are skipped")
      it("items without the indexed field are not vectorised and come after the ranked ones", function()
        with_store({ index = INDEX }, function(s)
          local calls = {}
          local function counting(texts)
            for _, t in ipairs(texts) do calls[#calls + 1] = t end
            return embed(texts)
          end
          s.index.embed = counting
          assert(s:put({ "m" }, "no-text", { other = "cat cat cat" }))
          assert(s:put({ "m" }, "dog", { text = "dog" }))
          assert.same({ "dog" }, calls)
          local found = assert(s:search({ "m" }, { query = "dog" }))
          assert.same({ "dog", "no-text" }, keys_of(found))
          assert.is_nil(found[2].score)
        end)
      end)

      -- BASE .. "PutOp" (index: False disables indexing; a list picks the fields)
      it("put's index = false skips the item, a list of paths picks its own fields", function()
        with_store({ index = INDEX }, function(s)
          assert(s:put({ "m" }, "skipped", { text = "cat" }, { index = false }))
          assert(s:put({ "m" }, "own", { text = "sea", about = { "dog", "cat" } }, { index = { "about[*]" } }))
          local found = assert(s:search({ "m" }, { query = "cat" }))
          assert.same({ "own", "skipped" }, keys_of(found))
          assert.near(1.0, found[1].score, 1e-9)          -- best of its two vectors
          assert.is_nil(found[2].score)
        end)
      end)

      -- BASE .. "IndexConfig" (fields: nested paths, [*], whole document "$")
      it("field paths reach nested fields and list elements; $ embeds the whole value", function()
        with_store({ index = { embed = embed, dims = #VOCAB, fields = { "meta.title", "parts[-1].body" } } }, function(s)
          assert(s:put({ "m" }, "a", { meta = { title = "tree" }, parts = { { body = "car" }, { body = "road" } } }))
          local found = assert(s:search({ "m" }, { query = "road" }))
          assert.near(1.0, found[1].score, 1e-9)
          found = assert(s:search({ "m" }, { query = "car" }))
          assert.near(0.0, found[1].score, 1e-9)
        end)
        with_store({ index = { embed = embed, dims = #VOCAB } }, function(s)
          assert(s:put({ "m" }, "a", { x = "bird", y = { "bird" } }))
          local found = assert(s:search({ "m" }, { query = "bird" }))
          assert.near(1.0, found[1].score, 1e-9)
        end)
      end)

      -- BASE .. "SearchOp" (query together with filter)
      it("combines a query with filters, limit and offset", function()
        with_store({ index = INDEX }, function(s)
          assert(s:put({ "m" }, "1", { text = "cat", lang = "en" }))
          assert(s:put({ "m" }, "2", { text = "cat dog", lang = "en" }))
          assert(s:put({ "m" }, "3", { text = "cat", lang = "ko" }))
          assert(s:put({ "m" }, "4", { text = "dog", lang = "en" }))
          local found = assert(s:search({ "m" }, { query = "cat", filter = { lang = "en" }, limit = 2 }))
          assert.same({ "1", "2" }, keys_of(found))
          found = assert(s:search({ "m" }, { query = "cat", filter = { lang = "en" }, offset = 2 }))
          assert.same({ "4" }, keys_of(found))
        end)
      end)

      it("re-putting an item replaces its vectors", function()
        with_store({ index = INDEX }, function(s)
          assert(s:put({ "m" }, "k", { text = "cat" }))
          assert(s:put({ "m" }, "k", { text = "dog" }))
          local found = assert(s:search({ "m" }, { query = "cat" }))
          assert.near(0.0, found[1].score, 1e-9)
          assert(s:put({ "m" }, "k", { other = 1 }))
          found = assert(s:search({ "m" }, { query = "dog" }))
          assert.is_nil(found[1].score)
        end)
      end)

      it("an embed failure returns nil, err and writes nothing", function()
        with_store({ index = INDEX }, function(s)
          s.index.embed = function() return nil, "embedding service down" end
          local ok, err = s:put({ "m" }, "k", { text = "cat" })
          assert.is_nil(ok)
          assert.matches("embedding service down", err)
          s.index.embed = function() error("boom") end
          ok, err = s:search({ "m" }, { query = "cat" })
          assert.is_nil(ok)
          assert.matches("boom", err)
          s.index.embed = function(texts) return { { 1, 2 } } end
          ok, err = s:put({ "m" }, "k", { text = "cat" })
          assert.is_nil(ok)
          assert.matches("index.dims is 8", err)
          s.index.embed = embed
          assert.is_nil(s:get({ "m" }, "k"))
        end)
      end)

      -- LangGraph's stores ignore `query` when no index is configured
      it("without an index a query only filters, and gives no score", function()
        with_store(function(s)
          assert(s:put({ "m" }, "k", { text = "cat" }))
          local found = assert(s:search({ "m" }, { query = "cat" }))
          assert.same({ "k" }, keys_of(found))
          assert.is_nil(found[1].score)
        end)
      end)
    end)

    describe("concurrency", function()
      it("64 tasks writing one key: one of the written values wins whole", function()
        with_store(function(s)
          local tasks = {}
          for i = 1, 64 do
            tasks[i] = function()
              local payload = {}
              for j = 1, 20 do payload[j] = i end
              assert(s:put({ "race" }, "k", { writer = i, payload = payload }))
            end
          end
          mg.gather(tasks)
          local item = assert(s:get({ "race" }, "k"))
          local w = item.value.writer
          assert.is_true(w >= 1 and w <= 64)
          for j = 1, 20 do assert.equal(w, item.value.payload[j]) end
        end)
      end)

      it("the later of two writers wins", function()
        with_store(function(s)
          local q = mg.queue()
          local a = mg.spawn(function()
            assert(s:put({ "race" }, "k", { by = "a" }))
            q:put(true)
          end)
          local b = mg.spawn(function()
            q:get()
            assert(s:put({ "race" }, "k", { by = "b" }))
          end)
          a:join()
          b:join()
          assert.equal("b", assert(s:get({ "race" }, "k")).value.by)
        end)
      end)
    end)

    describe("update", function()
      local function count(v)
        v = v or { n = 0 }
        v.n = v.n + 1
        return v
      end

      it("creates the item, then changes what it reads", function()
        with_store(function(s)
          assert.same({ n = 1 }, s:update({ "u", "1" }, "c", count))
          assert.same({ n = 2 }, s:update({ "u", "1" }, "c", count))
          local item = assert(s:get({ "u", "1" }, "c"))
          assert.equal(2, item.value.n)
          assert.is_true(item.created_at <= item.updated_at)
        end)
      end)

      it("64 tasks updating one key, each yielding between read and write: all 64 count", function()
        with_store(function(s)
          local tasks = {}
          for i = 1, 64 do
            tasks[i] = function()
              assert(s:update({ "race" }, "n", function(v)
                mg.sleep(0)                     -- another task runs here
                v = v or { n = 0, by = {} }
                v.n = v.n + 1
                v.by[#v.by + 1] = i
                return v
              end))
            end
          end
          mg.gather(tasks)
          local v = assert(s:get({ "race" }, "n")).value
          assert.equal(64, v.n)
          assert.equal(64, #v.by)
        end)
      end)

      it("writes nothing when fn returns nil, fails whole when fn raises or returns what cannot be kept", function()
        with_store(function(s)
          assert(s:put({ "u" }, "k", { n = 1 }))
          assert.is_false(s:update({ "u" }, "k", function() return nil end))
          local r, err = s:update({ "u" }, "k", function() error("no such intent", 0) end)
          assert.is_nil(r)
          assert.matches("no such intent", err)
          r, err = s:update({ "u" }, "k", function() return { f = print } end)
          assert.is_nil(r)
          assert.matches("cannot be stored: .*value.f", err)
          assert.same({ n = 1 }, assert(s:get({ "u" }, "k")).value)
        end)
      end)

      it("puts with the given options", function()
        with_store(function(s, ctx)
          assert(s:update({ "u" }, "short", count, { ttl = 1 }))
          assert(s:update({ "u" }, "long", count))
          ctx.age(120)
          assert.is_nil(s:get({ "u" }, "short"))
          assert.equal(1, assert(s:get({ "u" }, "long")).value.n)
        end)
      end)

      it("raises bad argument errors naming the argument", function()
        with_store(function(s)
          local ok, err = pcall(s.update, s, { "u" }, "k", "not a function")
          assert.is_false(ok)
          assert.matches("bad argument #3 to 'update' %(function expected, got string%)", err)
          ok, err = pcall(s.update, s, {}, "k", count)
          assert.matches("bad argument #1 to 'update' %(namespace must not be empty%)", err)
          ok, err = pcall(s.update, s, { "u" }, "k", count, { bogus = 1 })
          assert.matches("bad argument #4 to 'update' %(unknown option 'bogus'%)", err)
        end)
      end)
    end)

    describe("patch", function()
      it("creates the item from {}, then sets fields and adds to integers, nested ones too", function()
        with_store(function(s)
          assert.is_true(s:patch({ "u", "1" }, "p", { set = { city = "서울" }, add = { turns = 1, intents = { waste = 1 } } }))
          assert.is_true(s:patch({ "u", "1" }, "p", { set = { last = "x" }, add = { turns = 2, intents = { waste = 1, bus = 5 } } }))
          local item = assert(s:get({ "u", "1" }, "p"))
          assert.same({ city = "서울", last = "x", turns = 3, intents = { waste = 2, bus = 5 } }, item.value)
          assert.equal("integer", math.type(item.value.turns))
          assert.is_true(item.created_at <= item.updated_at)
          -- what a patch does not name stays; a set replaces the whole field
          assert(s:put({ "u", "2" }, "p", { keep = { 1.5, "a" }, f = 2.5, obj = { a = 1, b = 2 }, n = 7 }))
          assert(s:patch({ "u", "2" }, "p", { set = { obj = { c = 3 } }, add = { n = -10, deep = { a = { b = 4 } } } }))
          assert.same({ keep = { 1.5, "a" }, f = 2.5, obj = { c = 3 }, n = -3, deep = { a = { b = 4 } } },
            assert(s:get({ "u", "2" }, "p")).value)
        end)
      end)

      it("refuses an addition to what is not an integer, or into what is not an object, writing nothing", function()
        with_store(function(s)
          local json = require "moongraph.json"
          local v = { f = 1.5, s = "3", n = json.null, l = { 1, 2 }, i = 1, max = math.maxinteger,
                      min = math.mininteger }
          assert(s:put({ "u" }, "k", v))
          for _, case in ipairs {
            { { f = 1 }, "f is not an integer" },
            { { s = 1 }, "s is not an integer" },
            { { n = 1 }, "n is not an integer" },
            { { l = { a = 1 } }, "l is not an object" },
            { { i = { a = 1 } }, "i is not an object" },
            { { i = 1, max = 1 }, "max is out of the integer range" },
            { { i = -(1 << 62), min = -1 }, "min is out of the integer range" },
          } do
            local r, err = s:patch({ "u" }, "k", { set = { touched = true }, add = case[1] })
            assert.is_nil(r)
            assert.truthy(tostring(err):find(case[2], 1, true), tostring(err))
          end
          assert.same(v, assert(s:get({ "u" }, "k")).value)
        end)
      end)

      it("with repair, replaces what an addition cannot take, and only that", function()
        with_store(function(s)
          local json = require "moongraph.json"
          assert(s:put({ "u" }, "k", { f = 5.0, s = "3", n = json.null, ok = 4, l = { 7, { x = 8 } },
            i = 1, o = { a = "x", b = 2, c = { d = 1.5 } }, keep = { 1.5 } }))
          -- l is a list: what a path reads through it counts as absent, as
          -- through any parent that is not an object
          assert.is_true(s:patch({ "u" }, "k", { set = { last = "y" },
            add = { f = 1, s = 1, n = 1, ok = 1, l = { ["1"] = 1, ["2"] = { x = 1 } }, i = { a = 2 },
                    o = { a = 3, b = 3, c = { d = 3 } }, new = { z = 1 } } }, { repair = true }))
          local v = assert(s:get({ "u" }, "k")).value
          assert.same({ f = 1, s = 1, n = 1, ok = 5, l = { ["1"] = 1, ["2"] = { x = 1 } }, i = { a = 2 },
            o = { a = 3, b = 5, c = { d = 3 } }, new = { z = 1 }, keep = { 1.5 }, last = "y" }, v)
          assert.equal("integer", math.type(v.f))
          -- the range is still checked
          assert(s:put({ "u" }, "m", { max = math.maxinteger }))
          local r, err = s:patch({ "u" }, "m", { add = { max = 1 } }, { repair = true })
          assert.is_nil(r)
          assert.truthy(tostring(err):find("max is out of the integer range", 1, true), tostring(err))
          assert.has_error(function() s:patch({ "u" }, "m", { add = { max = 1 } }, { repair = 1 }) end)
        end)
      end)

      it("tells apart field names that hold separators: each patch adds to its own fields", function()
        with_store(function(s)
          assert(s:patch({ "t" }, "a", { add = { ["p\1q"] = 1 } }))
          assert(s:patch({ "t" }, "b", { add = { p = 1, q = 2 } }))
          assert(s:patch({ "t" }, "a", { add = { ["x.y"] = 1, [""] = 1 } }))
          assert(s:patch({ "t" }, "b", { add = { x = { y = 3 } } }))
          assert(s:patch({ "t" }, "c", { add = { ["1:p"] = 4 } }))
          assert(s:patch({ "t" }, "d", { add = { ["1"] = { p = 5 } } }))
          assert.same({ ["p\1q"] = 1, ["x.y"] = 1, [""] = 1 }, assert(s:get({ "t" }, "a")).value)
          assert.same({ p = 1, q = 2, x = { y = 3 } }, assert(s:get({ "t" }, "b")).value)
          assert.same({ ["1:p"] = 4 }, assert(s:get({ "t" }, "c")).value)
          assert.same({ ["1"] = { p = 5 } }, assert(s:get({ "t" }, "d")).value)
        end)
      end)

      it("64 tasks patching one key while 64 update it: none is lost", function()
        with_store(function(s)
          local tasks = {}
          for i = 1, 64 do
            tasks[#tasks + 1] = function()
              assert(s:patch({ "race" }, "n", { add = { n = 1, by_patch = 1 } }))
            end
            tasks[#tasks + 1] = function()
              assert(s:update({ "race" }, "n", function(x)
                mg.sleep(0)                     -- a patch may come here: it waits
                x = x or {}
                x.n = (x.n or 0) + 1
                return x
              end))
            end
          end
          mg.gather(tasks)
          local x = assert(s:get({ "race" }, "n")).value
          assert.equal(128, x.n)
          assert.equal(64, x.by_patch)
        end)
      end)

      it("puts with the given options", function()
        with_store(function(s, ctx)
          assert(s:patch({ "u" }, "short", { add = { n = 1 } }, { ttl = 1 }))
          assert(s:patch({ "u" }, "long", { add = { n = 1 } }))
          ctx.age(120)
          assert.is_nil(s:get({ "u" }, "short"))
          -- an expired item is no item: the next patch starts from {}
          assert(s:patch({ "u" }, "short", { add = { n = 5 } }))
          assert.equal(5, assert(s:get({ "u" }, "short")).value.n)
          assert.equal(1, assert(s:get({ "u" }, "long")).value.n)
        end)
      end)

      it("raises bad argument errors naming the argument", function()
        with_store(function(s)
          local function raises(pat, ...)
            local ok, err = pcall(s.patch, s, ...)
            assert.is_false(ok)
            assert.matches(pat, tostring(err))
          end
          raises("bad argument #3 to 'patch' %(patch table {set =, add =} expected, got string%)", { "u" }, "k", "x")
          raises("bad argument #3 to 'patch' %(unknown patch part 'put' %(set or add%)%)", { "u" }, "k", { put = {} })
          raises("bad argument #3 to 'patch' %(patch.add.a.b must be an integer or a table of them, got a float%)",
            { "u" }, "k", { add = { a = { b = 1.5 } } })
          raises("bad argument #3 to 'patch' %(patch.add.a must be a table of fields, got a list%)",
            { "u" }, "k", { add = { a = { 1 } } })
          raises("bad argument #3 to 'patch' %(field 'x' is both in patch.set and in patch.add%)",
            { "u" }, "k", { set = { x = 1 }, add = { x = { y = 1 } } })
          raises("bad argument #3 to 'patch' %(patch.set.f ", { "u" }, "k", { set = { f = print } })
          raises("bad argument #3 to 'patch' %(patch.set must be a table of fields", { "u" }, "k", { set = { 1 } })
          local loop = {}
          loop.a = loop
          raises("bad argument #3 to 'patch' %(patch.add.a is a table that contains itself%)", { "u" }, "k", { add = loop })
          local many = {}
          for i = 1, 101 do many["f" .. i] = 1 end
          raises("bad argument #3 to 'patch' %(patch.add holds more than 100 integers%)", { "u" }, "k", { add = many })
          raises("bad argument #1 to 'patch' %(namespace must not be empty%)", {}, "k", {})
          raises("bad argument #4 to 'patch' %(unknown option 'bogus'%)", { "u" }, "k", {}, { bogus = 1 })
        end)
      end)
    end)

    describe("misuse", function()
      it("raises bad argument errors naming the argument", function()
        with_store(function(s)
          local function raises(pat, fn, ...)
            local ok, err = pcall(fn, ...)
            assert.is_false(ok)
            assert.matches(pat, tostring(err))
          end
          raises("bad argument #1 to 'put' %(namespace must not be empty%)", s.put, s, {}, "k", {})
          raises("bad argument #1 to 'put' %(namespace label 2 is empty%)", s.put, s, { "a", "" }, "k", {})
          raises("bad argument #1 to 'get' %(namespace label 1 must be a string", s.get, s, { 1 }, "k")
          raises("NUL", s.put, s, { "a\0b" }, "k", {})
          raises("bad argument #2 to 'put' %(key must be a string", s.put, s, { "a" }, 5, {})
          raises("bad argument #2 to 'get' %(key must be UTF%-8", s.get, s, { "a" }, "\xff")
          raises("bad argument #3 to 'put' %(value must be a table of fields", s.put, s, { "a" }, "k", "text")
          raises("bad argument #3 to 'put' %(value must be a table of fields, not a list", s.put, s, { "a" }, "k", { 1, 2 })
          raises("bad argument #3 to 'put' %(value.f ", s.put, s, { "a" }, "k", { f = print })
          -- the path to what is wrong, however deep
          raises("bad argument #3 to 'put' %(value.a.b%[2%] is not UTF%-8 text%)", s.put, s, { "a" }, "k",
            { a = { b = { "ok", "\xff" } } })
          raises("bad argument #3 to 'put' %(value.a mixes list items and string keys%)", s.put, s, { "a" }, "k",
            { a = { 1, x = 2 } })
          local loop = {}
          loop.self = { loop }
          raises("bad argument #3 to 'put' %(value.l.self%[1%] is a table that contains itself%)", s.put, s,
            { "a" }, "k", { l = loop })
          raises("bad argument #4 to 'put' %(ttl must be a positive number", s.put, s, { "a" }, "k", {}, { ttl = -1 })
          raises("bad argument #4 to 'put' %(unknown option 'bogus'", s.put, s, { "a" }, "k", {}, { bogus = 1 })
          raises("bad argument #2 to 'search' %(unknown filter operator '%$regex'", s.search, s, {},
            { filter = { a = { ["$regex"] = "x" } } })
          raises("bad argument #2 to 'search' %(filter on 'a' mixes operators and fields", s.search, s, {},
            { filter = { a = { ["$gt"] = 1, b = 2 } } })
          raises("bad argument #2 to 'search' %(limit must be an integer", s.search, s, {}, { limit = 1.5 })
          raises("bad argument #1 to 'list_namespaces' %(max_depth must be an integer >= 1", s.list_namespaces, s,
            { max_depth = 0 })
          raises("bad argument #1 to 'batch' %(op 2 %(get%): key must be a string", s.batch, s,
            { { op = "list_namespaces" }, { op = "get", namespace = { "a" } } })
          raises("bad argument #1 to 'batch' %(op 1 must be a table", s.batch, s, { "get" })
          raises("bad argument #1 to 'batch' %(op 1: op must be get, put, delete, search or list_namespaces",
            s.batch, s, { { op = "upsert" } })
          raises("bad self to 'get'", s.get, nil, { "a" }, "k")
        end)
      end)
    end)
  end)
end
