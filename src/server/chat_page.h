// server/chat_page.h — the chat page served at GET / (and /index.html): one static HTML file
// (src/server/chat_page.html: HTML, CSS and JavaScript, no build step) compiled into the binary
// by cmake/EmbedText.cmake. It streams /v1/chat/completions (fetch + ReadableStream over the
// server-sent events), shows tokens/s, stops a reply (AbortController: the server sees the
// hang-up and cancels the request), and sets the system prompt, temperature, top_p, max_tokens
// and the API key (kept in the browser's localStorage). `?q=TEXT` sends TEXT once the page has
// loaded (the browser test drives it that way); `?key=KEY` fills in the key.
#pragma once

#include <string_view>

namespace splitflow {

std::string_view chat_page_html();

}  // namespace splitflow
