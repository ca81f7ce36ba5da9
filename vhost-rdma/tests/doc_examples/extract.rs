//! What counts as an example in a Markdown file, and the command lines it
//! stands for (the rules are in `tests/doc_examples.rs`'s header). Pure text
//! work; the runner is in the parent module.

use std::sync::LazyLock;

use regex::Regex;

/// `<!-- example: skip REASON -->`.
static SKIP: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<!--\s*example:\s*skip\b\s*(.*?)\s*-->").unwrap());
/// A fence opening (or closing) a code block.
static FENCE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*(```|~~~)").unwrap());
/// `C="vhost-rdma ctl ..."`: a variable holding a command (either quote).
static ASSIGN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^([A-Za-z_][A-Za-z0-9_]*)=(?:"(.*vhost-rdma\b.*)"|'(.*vhost-rdma\b.*)')\s*$"#)
        .unwrap()
});
/// A `NAME=VALUE` word before the command word.
static ENV_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*=").unwrap());
/// An optional `[...]` group (no nesting).
static GROUP: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\[([^\[\]]*)\]").unwrap());
/// An upper-case placeholder word (`ID`, `N`, `PORT`).
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\A[A-Z][A-Z0-9_]*\z").unwrap());
/// A socket path (`/run/x/a.sock`, `a.sock`), anchored where it may start
/// (not glued to a word before it: checked by [`rewrite_sockets`]).
static SOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A(/?[\w./-]*?)([\w.-]+\.sock)\b").unwrap());
/// The sockets a `serve` line creates, in its rewritten arguments.
static SOCK_PATH: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"/[^,=\s]*\.sock").unwrap());

/// Shell words that end the command: what follows is not run.
const OPERATORS: &[&str] = &[
    "|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "|&",
];

/// One example: where it is, its text (prompt cut, `$C` expanded) and the
/// reason its block is marked skip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// `FILE:LINE` (the first line of a continued command).
    pub place: String,
    pub text: String,
    pub skip: Option<String>,
}

/// A fenced code block: its first body line's number (1-based), its body
/// lines and the skip reason of a `<!-- example: skip -->` before it.
struct Block<'a> {
    first: usize,
    body: &'a [&'a str],
    skip: Option<String>,
}

fn blocks<'a>(lines: &'a [&'a str]) -> Vec<Block<'a>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(m) = FENCE.captures(lines[i]) else {
            i += 1;
            continue;
        };
        let fence = m.get(1).unwrap().as_str();
        // the nearest non-blank line before the fence may mark it skip
        let skip = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| SKIP.captures(l))
            .map(|c| match c.get(1).map(|g| g.as_str()) {
                Some(r) if !r.is_empty() => r.to_string(),
                _ => "marked skip".to_string(),
            });
        let mut end = i + 1;
        while end < lines.len() && !lines[end].trim_start().starts_with(fence) {
            end += 1;
        }
        out.push(Block {
            first: i + 2,
            body: &lines[i + 1..end],
            skip,
        });
        i = end + 1;
    }
    out
}

/// (line number, text) with `\` continuations joined.
fn logical_lines(first: usize, body: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = None;
    for (n, line) in (first..).zip(body) {
        let start_n = *start.get_or_insert(n);
        if let Some(joined) = line.trim_end().strip_suffix('\\') {
            cur.push_str(joined);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        out.push((start_n, std::mem::take(&mut cur)));
        start = None;
    }
    if let Some(n) = start {
        out.push((n, cur));
    }
    out
}

/// Drops `sudo` and `NAME=VALUE` words before the command word.
fn strip_prefixes(toks: &mut Vec<String>) {
    let n = toks
        .iter()
        .take_while(|t| *t == "sudo" || ENV_PREFIX.is_match(t))
        .count();
    toks.drain(..n);
}

/// Every example of Markdown `text`, named `rel` in [`Example::place`].
pub fn examples(rel: &str, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.split('\n').collect();
    // a variable set in one block is used in later ones (one shell session
    // per file); reassigning keeps its place in the order of expansion
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for block in blocks(&lines) {
        // with `$ ` prompts in a block, only the prompt lines are commands
        let prompts = block.body.iter().any(|l| l.starts_with("$ "));
        for (n, mut text) in logical_lines(block.first, block.body) {
            if prompts {
                match text.strip_prefix("$ ") {
                    Some(rest) => text = rest.to_string(),
                    None => continue,
                }
            }
            if let Some(c) = ASSIGN.captures(text.trim()) {
                let name = c[1].to_string();
                let value = c.get(2).or(c.get(3)).unwrap().as_str().to_string();
                match vars.iter_mut().find(|(k, _)| *k == name) {
                    Some(slot) => slot.1 = value,
                    None => vars.push((name, value)),
                }
                continue;
            }
            for (name, value) in &vars {
                let re =
                    Regex::new(&format!(r"^(\s*)\$\{{?{}\b\}}?", regex::escape(name))).unwrap();
                if let Some(c) = re.captures(&text) {
                    let end = c.get(0).unwrap().end();
                    text = format!("{}{value}{}", &c[1], &text[end..]);
                }
            }
            let Ok(mut toks) = shell_split(&text) else {
                continue;
            };
            strip_prefixes(&mut toks);
            let is_ours = toks
                .first()
                .is_some_and(|t| t.rsplit('/').next() == Some("vhost-rdma"));
            if is_ours {
                out.push(Example {
                    place: format!("{rel}:{n}"),
                    text,
                    skip: block.skip.clone(),
                });
            }
        }
    }
    out
}

/// The command lines an example stands for: without its `[...]` groups,
/// then with each group (each `|` alternative) in turn. A group holding a
/// placeholder (`ID`, `<x>`) is only left out.
pub fn variants(text: &str) -> Vec<String> {
    let groups: Vec<regex::Captures> = GROUP.captures_iter(text).collect();
    if groups.is_empty() {
        return vec![text.to_string()];
    }
    let strip = |keep: Option<(usize, &str)>| {
        let mut s = String::new();
        let mut prev = 0;
        for (k, g) in groups.iter().enumerate() {
            let whole = g.get(0).unwrap();
            s.push_str(&text[prev..whole.start()]);
            if let Some((_, alt)) = keep.filter(|(i, _)| *i == k) {
                s.push_str(alt);
            }
            prev = whole.end();
        }
        s.push_str(&text[prev..]);
        s
    };
    let mut out = vec![strip(None)];
    for (k, g) in groups.iter().enumerate() {
        let inner = &g[1];
        if inner.split_whitespace().any(|w| PLACEHOLDER.is_match(w)) || inner.contains('<') {
            continue;
        }
        for alt in inner.split('|') {
            out.push(strip(Some((k, alt.trim()))));
        }
    }
    out
}

/// `tmp` joined with `name`, as a string.
fn join(tmp: &str, name: &str) -> String {
    if tmp.ends_with('/') {
        format!("{tmp}{name}")
    } else {
        format!("{tmp}/{name}")
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every socket path in word `t` (alone or inside `NAME=PATH,...`) moved
/// into directory `tmp`, keeping its file name.
pub fn rewrite_sockets(t: &str, tmp: &str) -> String {
    let mut out = String::new();
    let mut pos = 0;
    while pos < t.len() {
        // a path does not start glued to a word, a dot or a dash before it
        let glued = t[..pos]
            .chars()
            .next_back()
            .is_some_and(|c| is_word_char(c) || c == '.' || c == '-');
        if !glued {
            if let Some(c) = SOCK.captures(&t[pos..]) {
                out.push_str(&join(tmp, &c[2]));
                pos += c.get(0).unwrap().end();
                continue;
            }
        }
        let ch = t[pos..].chars().next().unwrap();
        out.push(ch);
        pos += ch.len_utf8();
    }
    out
}

/// The arguments (after the command word) of one variant: cut at shell
/// operators, sockets moved into `tmp`, `--control`'s value replaced by
/// `control` if given, upper-case placeholders made `1`. `Ok(None)` if a
/// `<...>` placeholder is left.
pub fn argv(text: &str, tmp: &str, control: Option<&str>) -> Result<Option<Vec<String>>, String> {
    let mut toks = shell_split(text)?;
    strip_prefixes(&mut toks);
    let cut = toks
        .iter()
        .position(|t| OPERATORS.contains(&t.as_str()) || t.starts_with("2>") || t.starts_with('>'))
        .unwrap_or(toks.len());
    let toks = toks.get(1..cut).unwrap_or_default();
    if toks.iter().any(|t| t.contains('<') && t.contains('>')) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(toks.len());
    for (i, t) in toks.iter().enumerate() {
        let mut t = match control {
            Some(c) if i > 0 && toks[i - 1] == "--control" => c.to_string(),
            _ => rewrite_sockets(t, tmp),
        };
        if PLACEHOLDER.is_match(&t) {
            t = "1".to_string();
        }
        out.push(t);
    }
    Ok(Some(out))
}

/// The socket paths a `serve` line's rewritten arguments name.
pub fn sockets(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| SOCK_PATH.find_iter(a).map(|m| m.as_str().to_string()))
        .collect()
}

/// The name an example variant is reported under: its words, comments dropped.
pub fn display(text: &str) -> String {
    shell_split(text)
        .map(|w| w.join(" "))
        .unwrap_or_else(|_| text.trim().to_string())
}

/// Splits a command line into words as POSIX `sh` (and Python's
/// `shlex.split(s, comments=True)`) does: quotes, backslashes, `#` comments;
/// no expansion. An unclosed quote or a trailing backslash is an error.
pub fn shell_split(s: &str) -> Result<Vec<String>, String> {
    #[derive(Clone, Copy, PartialEq)]
    enum St {
        Space,
        Word,
        Quote(char),
        Escape(Option<char>),
    }
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut st = St::Space;
    let mut chars = s.chars();
    loop {
        let c = chars.next();
        match (st, c) {
            (St::Space, None) => break,
            (St::Word, None) => {
                if !word.is_empty() || quoted {
                    words.push(std::mem::take(&mut word));
                }
                break;
            }
            (St::Quote(_), None) => return Err("no closing quotation".into()),
            (St::Escape(_), None) => return Err("no escaped character".into()),
            (St::Space | St::Word, Some(c)) if " \t\r\n".contains(c) => {
                if st == St::Word && (!word.is_empty() || quoted) {
                    words.push(std::mem::take(&mut word));
                }
                quoted = false;
                st = St::Space;
            }
            (St::Space | St::Word, Some('#')) => {
                // a comment: the rest of the line goes
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                if st == St::Word && (!word.is_empty() || quoted) {
                    words.push(std::mem::take(&mut word));
                }
                quoted = false;
                st = St::Space;
            }
            (St::Space | St::Word, Some('\\')) => st = St::Escape(None),
            (St::Space | St::Word, Some(q @ ('"' | '\''))) => st = St::Quote(q),
            (St::Space | St::Word, Some(c)) => {
                word.push(c);
                st = St::Word;
            }
            (St::Quote(q), Some(c)) => {
                quoted = true;
                if c == q {
                    st = St::Word;
                } else if c == '\\' && q == '"' {
                    st = St::Escape(Some(q));
                } else {
                    word.push(c);
                }
            }
            (St::Escape(inside), Some(c)) => {
                // in double quotes only `"` and `\` are escaped
                if let Some(q) = inside {
                    if c != '\\' && c != q {
                        word.push('\\');
                    }
                }
                word.push(c);
                st = match inside {
                    Some(q) => St::Quote(q),
                    None => St::Word,
                };
            }
        }
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(md: &str) -> Vec<(String, String)> {
        examples("x.md", md)
            .into_iter()
            .map(|e| (e.place, e.text))
            .collect()
    }

    fn owned(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn only_vhost_rdma_lines_in_fences_are_examples() {
        let md = "\
vhost-rdma serve --outside-a-fence
```sh
ls -l
vhost-rdma ctl status
sudo RUST_LOG=debug ./target/release/vhost-rdma serve --port a=/run/a.sock
cargo run -p vhost-rdma
vhost-rdma-not
```
text
~~~
vhost-rdma --print-capabilities
```
not a fence end inside a tilde block
~~~
";
        assert_eq!(
            texts(md),
            owned(&[
                ("x.md:4", "vhost-rdma ctl status"),
                (
                    "x.md:5",
                    "sudo RUST_LOG=debug ./target/release/vhost-rdma serve --port a=/run/a.sock"
                ),
                ("x.md:11", "vhost-rdma --print-capabilities"),
            ])
        );
    }

    #[test]
    fn continuations_are_joined_and_numbered_by_their_first_line() {
        let md = "```\nvhost-rdma serve \\\n  --port a=/x/a.sock \\\n  --control /x/c.sock\nvhost-rdma ctl status\n```\n";
        let got = texts(md);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "x.md:2");
        assert_eq!(
            shell_split(&got[0].1).unwrap(),
            [
                "vhost-rdma",
                "serve",
                "--port",
                "a=/x/a.sock",
                "--control",
                "/x/c.sock"
            ]
        );
        assert_eq!(got[1], ("x.md:5".into(), "vhost-rdma ctl status".into()));
        // a continuation left open at the end of a block still counts
        assert_eq!(
            texts("```\nvhost-rdma ctl \\\n```\n"),
            owned(&[("x.md:2", "vhost-rdma ctl  ")])
        );
    }

    #[test]
    fn with_prompts_only_prompt_lines_are_commands() {
        let md = "```\n$ vhost-rdma ctl findings\nvhost-rdma ctl this-is-output\n$ echo hi\n$ vhost-rdma ctl flows\n```\n";
        assert_eq!(
            texts(md),
            owned(&[
                ("x.md:2", "vhost-rdma ctl findings"),
                ("x.md:5", "vhost-rdma ctl flows"),
            ])
        );
    }

    #[test]
    fn a_command_variable_expands_in_its_block_and_later_ones() {
        let md = "\
```sh
$C status
C=\"vhost-rdma ctl --control /run/c.sock\"
$C flows [--json]   # a comment
  ${C} findings
$CX nothing
```
```
$C later
D='vhost-rdma serve'
$D --port a=/a.sock
```
```
C=\"vhost-rdma ctl\"
$C reassigned
```
";
        assert_eq!(
            texts(md),
            owned(&[
                (
                    "x.md:4",
                    "vhost-rdma ctl --control /run/c.sock flows [--json]   # a comment"
                ),
                ("x.md:5", "  vhost-rdma ctl --control /run/c.sock findings"),
                ("x.md:9", "vhost-rdma ctl --control /run/c.sock later"),
                ("x.md:11", "vhost-rdma serve --port a=/a.sock"),
                ("x.md:15", "vhost-rdma ctl reassigned"),
            ])
        );
    }

    #[test]
    fn a_skip_marker_before_a_fence_skips_its_block() {
        let md = "\
<!-- example: skip needs root -->

```
vhost-rdma serve --port a=/a.sock
```
<!-- example: skip -->
```
vhost-rdma ctl status
```
<!-- example: skip not this one -->
text between
```
vhost-rdma ctl flows
```
";
        let got: Vec<_> = examples("x.md", md)
            .into_iter()
            .map(|e| (e.place, e.skip))
            .collect();
        assert_eq!(
            got,
            [
                ("x.md:4".to_string(), Some("needs root".to_string())),
                ("x.md:8".to_string(), Some("marked skip".to_string())),
                ("x.md:13".to_string(), None),
            ]
        );
    }

    #[test]
    fn unsplittable_lines_are_not_examples() {
        assert!(texts("```\nvhost-rdma ctl \"open\n```\n").is_empty());
    }

    #[test]
    fn optional_groups_and_alternatives() {
        assert_eq!(variants("vhost-rdma ctl status"), ["vhost-rdma ctl status"]);
        assert_eq!(
            variants("vhost-rdma ctl checker [on|off] [--json]"),
            [
                "vhost-rdma ctl checker  ",
                "vhost-rdma ctl checker on ",
                "vhost-rdma ctl checker off ",
                "vhost-rdma ctl checker  --json",
            ]
        );
        // a group with a placeholder is only left out
        assert_eq!(
            variants("vhost-rdma ctl trace [--port NAME] [--file <f>] show"),
            ["vhost-rdma ctl trace   show"]
        );
    }

    #[test]
    fn arguments_are_cut_rewritten_and_filled() {
        let a = |t: &str, ctl: Option<&str>| argv(t, "/tmp/T", ctl).unwrap();
        assert_eq!(
            a(
                "sudo X=1 vhost-rdma serve --port a=/run/v/a.sock,kind=gve --control ctl.sock | tee log",
                None
            ),
            Some(vec![
                "serve".into(),
                "--port".into(),
                "a=/tmp/T/a.sock,kind=gve".into(),
                "--control".into(),
                "/tmp/T/ctl.sock".into(),
            ])
        );
        assert_eq!(
            a(
                "vhost-rdma ctl --control /run/v/ctl.sock host vh stop ID 2>/dev/null",
                Some("/L/c.sock")
            ),
            Some(vec![
                "ctl".into(),
                "--control".into(),
                "/L/c.sock".into(),
                "host".into(),
                "vh".into(),
                "stop".into(),
                "1".into(),
            ])
        );
        assert_eq!(a("vhost-rdma ctl host <name> stop", None), None);
        // only a placeholder's brackets left after the cut count
        assert_eq!(
            a("vhost-rdma ctl status > <file>", None),
            Some(vec!["ctl".into(), "status".into()])
        );
        assert!(argv("vhost-rdma ctl \"x", "/t", None).is_err());
    }

    #[test]
    fn socket_paths_move_keeping_their_names() {
        let r = |t: &str| rewrite_sockets(t, "/T");
        assert_eq!(r("/run/vhost-rdma/a.sock"), "/T/a.sock");
        assert_eq!(r("a.sock"), "/T/a.sock");
        assert_eq!(r("g=/run/x/g.sock,kind=gve"), "g=/T/g.sock,kind=gve");
        assert_eq!(r("ctl-a.sock"), "/T/ctl-a.sock");
        assert_eq!(r("a.socket"), "a.socket");
        assert_eq!(r("x.sockets.sock"), "/T/x.sockets.sock");
        assert_eq!(r("fabric.pcapng"), "fabric.pcapng");
        assert_eq!(
            sockets(&[
                "a=/T/a.sock,mac=1".into(),
                "/T/c.sock".into(),
                "b.sock".into()
            ]),
            ["/T/a.sock", "/T/c.sock"]
        );
    }

    #[test]
    fn words_split_as_the_shell_does() {
        let s = |t: &str| shell_split(t).unwrap();
        assert_eq!(s("a  b\tc"), ["a", "b", "c"]);
        assert_eq!(s("a # b c"), ["a"]);
        assert_eq!(s("foo#bar baz"), ["foo"]);
        assert_eq!(s("'#' \"#\""), ["#", "#"]);
        assert_eq!(s(r#"a\ b "x\"y\z" 'q\'"#), ["a b", "x\"y\\z", "q\\"]);
        assert_eq!(s("'' \"\" x''"), ["", "", "x"]);
        assert_eq!(s("k=\"v w\",z"), ["k=v w,z"]);
        assert!(shell_split("'open").is_err());
        assert!(shell_split("end\\").is_err());
        assert_eq!(
            display("vhost-rdma ctl  flows   # c"),
            "vhost-rdma ctl flows"
        );
    }
}
