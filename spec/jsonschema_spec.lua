local jsonschema = require "moongraph.jsonschema"
local cjson = require "cjson"

local v = jsonschema.validate

describe("moongraph.jsonschema", function()
  it("checks types, with integral floats as integers and lists of types", function()
    assert.is_nil(v({ type = "integer" }, 3.0))
    assert.matches("expected integer, got number", v({ type = "integer" }, 3.5))
    assert.is_nil(v({ type = { "string", "null" } }, cjson.null))
    assert.matches("%$: expected string or null, got boolean", v({ type = { "string", "null" } }, true))
    assert.matches("expected object, got array", v({ type = "object" }, { 1 }))
    assert.is_nil(v({ type = "array" }, {}))
  end)

  it("checks properties, required and additionalProperties", function()
    local s = { type = "object", required = { "a" }, properties = { a = { type = "string" } },
      additionalProperties = false }
    assert.is_nil(v(s, { a = "x" }))
    assert.matches('%$: missing required property "a"', v(s, {}))
    assert.matches("%$%.a: expected string, got integer", v(s, { a = 1 }))
    assert.matches('unexpected property "b"', v(s, { a = "x", b = 1 }))
    assert.matches("%$%.b: expected integer", v({ type = "object", additionalProperties = { type = "integer" } },
      { b = "x" }))
  end)

  it("checks enum, const, string lengths in characters and number bounds", function()
    assert.matches('"c" is not one of "a", "b"', v({ enum = { "a", "b" } }, "c"))
    assert.matches("must be 3", v({ const = 3 }, 4))
    assert.is_nil(v({ maxLength = 3 }, "본죽집"))
    assert.matches("longer than 2 characters", v({ maxLength = 2 }, "본죽집"))
    assert.matches("shorter than 1 characters", v({ minLength = 1 }, ""))
    assert.matches("below the minimum 0", v({ minimum = 0 }, -1))
    assert.matches("above the maximum 10", v({ maximum = 10 }, 11))
    assert.matches("must be greater than 0", v({ exclusiveMinimum = 0 }, 0))
    assert.matches("must be less than 1", v({ exclusiveMaximum = 1 }, 1))
    assert.matches("not a multiple of 2", v({ multipleOf = 2 }, 3))
  end)

  it("checks items, their counts and uniqueness with 0-based paths", function()
    local s = { type = "array", items = { type = "string" }, minItems = 1, maxItems = 3, uniqueItems = true }
    assert.is_nil(v(s, { "a", "b" }))
    assert.matches("%$%[1%]: expected string, got integer", v(s, { "a", 2 }))
    assert.matches("fewer than 1 items", v(s, {}))
    assert.matches("more than 3 items", v(s, { "a", "b", "c", "d" }))
    assert.matches("items 0 and 1 are equal", v(s, { "a", "a" }))
  end)

  it("checks anyOf, oneOf, allOf and not", function()
    local any = { anyOf = { { type = "string" }, { type = "integer" } } }
    assert.is_nil(v(any, 3))
    assert.matches("matches none of anyOf", v(any, true))
    local one = { oneOf = { { type = "integer" }, { type = "number" } } }
    assert.matches("matches more than one of oneOf", v(one, 3))
    assert.is_nil(v(one, 3.5))
    assert.matches("matches none of oneOf", v(one, "x"))
    assert.matches("below the minimum 5", v({ allOf = { { type = "integer" }, { minimum = 5 } } }, 3))
    assert.matches('must not match the schema in "not"', v({ ["not"] = { type = "string" } }, "x"))
  end)

  it("follows local $ref and refuses a loop clearly", function()
    local s = { ["$defs"] = { name = { type = "string", minLength = 2 } }, type = "object",
      properties = { n = { ["$ref"] = "#/$defs/name" } } }
    assert.is_nil(v(s, { n = "ab" }))
    assert.matches("%$%.n: shorter than 2 characters", v(s, { n = "a" }))
    assert.matches("cannot resolve %$ref", v({ ["$ref"] = "#/nope" }, 1))
    assert.matches("nests too deep", v({ ["$ref"] = "#" }, 1))
  end)

  it("ignores keywords it does not check", function()
    assert.is_nil(v({ type = "string", format = "email", pattern = "^x", description = "d" }, "plain"))
  end)
end)
