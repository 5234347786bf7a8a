"""The desktop bundle's entry point: coordex's stdio MCP server, as `coordex mcp` runs it."""

import sys

from coordex.cli import main

if __name__ == "__main__":
    sys.exit(main(["mcp", *sys.argv[1:]]))
