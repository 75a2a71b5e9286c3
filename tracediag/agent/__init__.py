"""tracediag for agents: `tracediag mcp`, a Model Context Protocol server over stdio.

- `tools.py`: what each tool does (analyze, findings, explain, query, diff, check), as plain functions from
  paths to JSON-ready dicts — the same library calls the CLI makes, no MCP import;
- `readonly_sql.py`: the `query` tool's guard: one SELECT, a read-only connection without file access, a row
  cap and a time limit;
- `server.py`: the MCP server (the `mcp` SDK, an optional extra): the tools with JSON-schema arguments and
  structured results, progress notifications, the store's column docs as resources, and every error as a
  tool error with the CLI's one-line message.
"""
