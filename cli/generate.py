"""`lite run` and `lite chat`: generate text, streamed to standard output.

With a model that carries a chat template (the default SmolLM2-135M-Instruct does), `lite run`
sends the prompt as a user turn, because an instruct model given bare text tends to end its turn
at once; `--no-chat` sends the text as it is (completion), and echoes it as llama.cpp does.

Special tokens: a chat message is text (a typed "<|im_end|>" is not the end-of-turn token); a
`--no-chat` prompt is the user's own raw prompt, so its control-token spellings are parsed, as
llama.cpp's llama-cli parses them in a -p prompt.

Ctrl-C while an answer streams in a chat stops that answer and returns to the prompt; Ctrl-C at
the prompt ends the session.
"""
import logging
import os
import signal
import sys
import threading

import click

from lite.cli.options import _positive, count_or_all, engine_kwargs, model_options, sampling_options
from lite.errors import LiteError

MODEL_HELP = "GGUF file, or a known model: smollm2 (default), gemma3."


class StdoutClosed(Exception):
    """The reader of standard output went away (`lite run ... | head`): stop quietly."""


class Out:
    """Standard output for streamed text: a closed pipe becomes StdoutClosed, and a locale that
    cannot spell a character gets a replacement instead of an error."""

    def __init__(self):
        enc = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
        if enc != "utf8" and hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(errors="replace")

    def write(self, text, flush=True):
        try:
            sys.stdout.write(text)
            if flush:
                sys.stdout.flush()
        except BrokenPipeError:
            raise StdoutClosed() from None


def checked_text(text, source):
    """Text from the command line as proper Unicode: bytes that are not UTF-8 are an error naming
    where they came from (argv holds them as surrogate escapes)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        raw = text.encode(sys.getfilesystemencoding(), "surrogateescape")
    return decode_utf8(raw, source)


def decode_utf8(raw, source):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LiteError(f"{source} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}): save it as UTF-8") from None


def read_prompt(words, prompt, prompt_file):
    """The prompt from exactly one of: the arguments, -p TEXT ('-': standard input), -f FILE."""
    given = [s for s, v in (("a prompt argument", words), ("-p", prompt), ("-f", prompt_file)) if v]
    if len(given) > 1:
        raise click.UsageError(f"give the prompt once: {' and '.join(given)} were both given")
    if prompt_file:
        try:
            with open(prompt_file, "rb") as f:
                return decode_utf8(f.read(), f"prompt file {prompt_file}")
        except OSError as e:
            raise LiteError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
    if prompt == "-":
        return decode_utf8(sys.stdin.buffer.read(), "standard input")
    if prompt is not None:
        return checked_text(prompt, "the prompt (-p)")
    if words:
        return checked_text(" ".join(words), "the prompt")
    return None


def stream_to(out, pieces, echo="", stopped=None):
    """Write the pieces; the echo goes out with the first piece (or at the end), so that an
    error in the prefill (context, bad weights) leaves standard output empty. Returns the text.
    stopped(): asked after each piece; true closes the stream there."""
    got = []
    for piece in pieces:
        if echo:
            out.write(echo, flush=False)
            echo = ""
        got.append(piece)
        out.write(piece)
        if stopped is not None and stopped():
            pieces.close()              # frees the engine at a token boundary
            break
    out.write(echo + "\n")
    return "".join(got)


class CtrlC:
    """While an answer streams, SIGINT only sets `hit`, read between pieces: the answer stops there
    and the chat goes on, and the engine is never interrupted inside a step."""

    def __enter__(self):
        self.hit, self._old = False, None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._on)
        return self

    def _on(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def generation_options(f):
    f = click.option("--stop", multiple=True, metavar="TEXT",
                     help="Stop when this text appears (not printed); repeatable.")(f)
    f = click.option("-t", "--threads", default=None, type=int, callback=_positive,
                     help="CPU threads for the CPU backend's matrix products (default: the "
                     "physical cores this process may run on).")(f)
    return f


def _llm(model, threads, engine_opts):
    from lite.api import LLM
    return LLM(model, threads=threads, **engine_kwargs(**engine_opts))


def chat_loop(llm, out, msgs, n_predict, sampling, stop, first=None):
    """Read a message a line from standard input, answer it with the whole conversation; the KV
    of the turns already seen is reused. /exit or end of input quits; Ctrl-C stops an answer (what
    came of it stays in the conversation), and at the prompt ends the session."""
    tty = sys.stdin.isatty()
    while True:
        if first is not None:
            line, first = first, None
        else:
            if tty:
                click.echo("> ", nl=False, err=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                click.echo("", err=True)
                raise
            if not line or line.strip() == "/exit":
                return
            line = line.rstrip("\n")
        if not line.strip():
            continue
        msgs.append({"role": "user", "content": line})
        with CtrlC() as ctrl_c:
            answer = stream_to(out, llm.stream(llm.chat_ids(msgs), max_tokens=n_predict, stop=stop,
                                               **sampling), stopped=lambda: ctrl_c.hit)
        if ctrl_c.hit:
            click.echo("lite: answer stopped (Ctrl-C); Ctrl-C at the prompt ends the chat", err=True)
        msgs.append({"role": "assistant", "content": answer})
        s = llm.last_stats
        logging.getLogger("lite.chat").info("turn: %d prompt tokens (%d reused), %d generated",
                                            s.prompt_tokens, s.reused_tokens, s.generated)


@click.command()
@click.argument("words", nargs=-1, metavar="[PROMPT]")
@click.option("-m", "--model", default=None, help=MODEL_HELP)
@click.option("-p", "--prompt", default=None, help="Prompt text; '-' reads standard input.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), default=None,
              help="Read the prompt from a file.")
@click.option("-n", "--n-predict", default=256, type=int, callback=count_or_all, show_default=True,
              help="Tokens to generate at most (-1: until an end-of-turn token or the context's end).")
@click.option("--chat/--no-chat", default=None,
              help="Send the prompt as a user turn in the model's chat template (the default when "
              "the file has one), or as plain text to complete (--no-chat).")
@click.option("-s", "--system", default=None, help="System message (chat).")
@click.option("-i", "--interactive", is_flag=True,
              help="Chat: after the answer, read more messages from standard input (history kept; "
              "Ctrl-C stops an answer).")
@generation_options
@sampling_options
@model_options
def run(words, model, prompt, prompt_file, n_predict, chat, system, interactive, stop, threads,
        sampling, **engine_opts):
    """Generate text from a prompt, streamed to standard output.

    \b
    lite run "Why is the sky blue?"                  the default model answers (chat template)
    lite run --no-chat -p "Once upon a time" -n 64   plain completion
    lite run -i                                      chat, a message a line
    """
    prompt = read_prompt(words, prompt, prompt_file)
    if prompt is None and not interactive:
        raise click.UsageError("give a prompt: lite run \"TEXT\", -p TEXT, -f FILE, or -i to chat")
    n = None if n_predict == -1 else n_predict
    llm = _llm(model, threads, engine_opts)
    out = Out()
    if chat is None:
        chat = llm.has_chat_template or interactive
    if interactive or chat:
        if system is not None:
            system = checked_text(system, "the system message (-s)")
        msgs = [{"role": "system", "content": system}] if system else []
        if interactive:
            chat_loop(llm, out, msgs, n, sampling, stop, first=prompt)
            return
        msgs.append({"role": "user", "content": prompt})
        stream_to(out, llm.stream(llm.chat_ids(msgs), max_tokens=n, stop=stop, **sampling))
    else:
        stream_to(out, llm.stream(prompt, max_tokens=n, stop=stop, **sampling), echo=prompt)
    s = llm.last_stats
    click.echo(f"lite: {llm.device}: prompt {s.prompt_tokens} tokens ({s.reused_tokens} cached), "
               f"{s.prefill_tps:.1f} tok/s; generated {s.generated} tokens, {s.decode_tps:.1f} tok/s",
               err=True)


@click.command()
@click.option("-m", "--model", default=None, help=MODEL_HELP)
@click.option("-s", "--system", default=None, help="System message.")
@click.option("-n", "--n-predict", default=512, type=int, callback=count_or_all, show_default=True,
              help="Tokens to generate at most per answer (-1: until the end of the turn).")
@generation_options
@sampling_options
@model_options
def chat(model, system, n_predict, stop, threads, sampling, **engine_opts):
    """Talk with the model: one message a line on standard input, answers streamed back.

    Each turn renders the whole conversation with the model's chat template; the KV of the turns
    already seen is reused, so only the new message is prefilled. Ctrl-C stops an answer; at the
    prompt, it ends the chat, as do /exit and the end of input. (`lite run -i` is the same.)"""
    llm = _llm(model, threads, engine_opts)
    system = checked_text(system, "the system message (-s)") if system is not None else None
    msgs = [{"role": "system", "content": system}] if system else []
    chat_loop(llm, Out(), msgs, None if n_predict == -1 else n_predict, sampling, stop)


def quiet_stdout():
    """After a closed pipe: point standard output at /dev/null, so that the flush at exit does not
    fail again (what `python -c ... | head` would print as 'Exception ignored')."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass
