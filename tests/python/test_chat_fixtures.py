#!/usr/bin/env python3
"""The committed chat-template fixtures (tests/fixtures/chat) are what jinja2 and transformers render
today: python/make_chat_fixtures.py --check regenerates them in memory and compares (recorded
package versions aside). A failure means a case, a template or the reference changed without the
fixtures being regenerated. Exit status 77 (skipped) when transformers, jinja2 or gguf is missing.
"""
import os
import subprocess
import sys

try:
    import gguf  # noqa: F401
    import jinja2  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    print("SKIP: the Python packages 'jinja2', 'transformers' and 'gguf' are needed")
    sys.exit(77)

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
shared = sys.argv[sys.argv.index("--shared") + 1] if "--shared" in sys.argv else os.path.join(repo, "..", "shared")
result = subprocess.run([sys.executable, os.path.join(repo, "python", "make_chat_fixtures.py"), "--check",
                         "--shared", shared])
sys.exit(result.returncode)
