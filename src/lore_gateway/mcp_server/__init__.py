"""The memory as an MCP server, for agents the gateway does not sit in front of.

``tools`` holds what the tools do (no SDK in it), ``queries`` the reads they need
beyond ``Memory``'s, ``server`` registers them with the official MCP SDK, and
``http`` serves them on the gateway's ``/mcp``; ``lore mcp`` (``cli/mcp_cmd.py``)
serves them over stdio. See docs/mcp.md.
"""
