// A Server-Sent Events parser (the WHATWG event-stream format).

/**
 * Yields {type, data, id} for each event of a byte stream (an async iterable
 * of Uint8Array, e.g. a fetch body). `data` is the parsed JSON, or the text
 * when it is not JSON. An event without data lines is not dispatched.
 */
export async function* parseSSE(chunks) {
  const decoder = new TextDecoder();
  let buf = "";
  let type = "";
  let data = [];
  let id;
  const line = function* (text) {
    if (text === "") {
      if (data.length) {
        const payload = data.join("\n");
        let value;
        try {
          value = JSON.parse(payload);
        } catch {
          value = payload;
        }
        yield { type: type || "message", data: value, id };
      }
      type = "";
      data = [];
      return;
    }
    if (text.startsWith(":")) return; // a comment, e.g. a keep-alive
    const i = text.indexOf(":");
    const name = i < 0 ? text : text.slice(0, i);
    let value = i < 0 ? "" : text.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") type = value;
    else if (name === "data") data.push(value);
    else if (name === "id" && !value.includes("\0")) id = value;
    // "retry" and unknown fields are ignored: reconnection is paced by the client's policy.
  };
  for await (const chunk of chunks) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
      if (buf[nl] === "\r" && nl === buf.length - 1) break; // maybe the \r of a \r\n split across chunks
      const text = buf.slice(0, nl);
      buf = buf.slice(nl + (buf[nl] === "\r" && buf[nl + 1] === "\n" ? 2 : 1));
      yield* line(text);
    }
  }
}
