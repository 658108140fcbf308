//! The Lua scripts (`lua/`), run as Redis Functions with an `EVALSHA` twin.
//!
//! Every script is a function of one library: the prelude (`lua/prelude/`)
//! at its top level, then each pool script's phases and its main function
//! (named after the script) in a block of their own, and the other scripts'
//! bodies wrapped in a function. The library is loaded once per Redis
//! (`FUNCTION LOAD`), so every definition is made once, not on every call,
//! and each call is an `FCALL`. Where Redis refuses Functions (an older or
//! restricted service, `FUNCTION` renamed away, an ACL), the adapter runs
//! the same code by `EVALSHA`, each pool script with the prelude joined in
//! after its `#!lua` line and a call of its main function at its end.
//!
//! The library's name carries a hash of its code, so deployments of two
//! versions sharing one Redis each call their own functions.
//!
//! A second, public library ([`PUBLIC_LIBRARY`], `proxy_pool_v<N>`, N
//! [`CONTRACT_VERSION`]) registers the writer-facing pool scripts (upsert,
//! contract, prune, inventory) under a stable name, for the programs in
//! other languages that call the contract (the health checker, the
//! Controller; docs/pool-contract.md). It is built by the same code from
//! the same sources, and loaded after the private one. Extraction stays
//! private: it is the HTTP API's job, and its arguments are internal.

use std::sync::LazyLock;

use redis::{Cmd, Script, ScriptInvocation, ToRedisArgs};

/// The prelude, in the order its parts build on each other.
const PRELUDE: [&str; 3] = [
    include_str!("../../lua/prelude/base.lua"),
    include_str!("../../lua/prelude/record.lua"),
    include_str!("../../lua/prelude/index.lua"),
];

fn prelude() -> String {
    PRELUDE.join("\n")
}

/// One script's source: its name in the library, its code (first line a
/// `#!lua` shebang), the parts joined in front of its body (its phases'
/// functions, when they are kept in files of their own) and whether it is
/// a pool script (it defines a main function of its name over the
/// prelude, taking the pool keys first).
struct Source {
    name: &'static str,
    code: &'static str,
    parts: &'static [&'static str],
    pool: bool,
}

/// The phases of `lua/extract.lua`, in the order they are joined before
/// its main (each sees the locals of those before it).
const EXTRACT_PARTS: [&str; 4] = [
    include_str!("../../lua/extract/request.lua"),
    include_str!("../../lua/extract/plan.lua"),
    include_str!("../../lua/extract/walk.lua"),
    include_str!("../../lua/extract/take.lua"),
];

const SOURCES: [Source; 10] = [
    Source {
        name: "extract",
        code: include_str!("../../lua/extract.lua"),
        parts: &EXTRACT_PARTS,
        pool: true,
    },
    Source {
        name: "upsert",
        code: include_str!("../../lua/upsert.lua"),
        parts: &[],
        pool: true,
    },
    Source {
        name: "contract",
        code: include_str!("../../lua/contract.lua"),
        parts: &[],
        pool: true,
    },
    Source {
        name: "prune",
        code: include_str!("../../lua/prune.lua"),
        parts: &[],
        pool: true,
    },
    Source {
        name: "inventory",
        code: include_str!("../../lua/inventory.lua"),
        parts: &[],
        pool: true,
    },
    Source {
        name: "ratelimit",
        code: include_str!("../../lua/ratelimit.lua"),
        parts: &[],
        pool: false,
    },
    Source {
        name: "usage_backlog",
        code: include_str!("../../lua/usage_backlog.lua"),
        parts: &[],
        pool: false,
    },
    Source {
        name: "client_lookup",
        code: include_str!("../../lua/client_lookup.lua"),
        parts: &[],
        pool: false,
    },
    Source {
        name: "client_put",
        code: include_str!("../../lua/client_put.lua"),
        parts: &[],
        pool: false,
    },
    Source {
        name: "client_revoke",
        code: include_str!("../../lua/client_revoke.lua"),
        parts: &[],
        pool: false,
    },
];

impl Source {
    /// Its first line, the `#!lua` shebang (with its flags).
    fn shebang(&self) -> &'static str {
        self.code
            .split_once('\n')
            .map_or(self.code, |(shebang, _)| shebang)
    }

    /// The code after the shebang, its parts joined in front.
    fn body(&self) -> String {
        let rest = self.code.split_once('\n').map_or("", |(_, rest)| rest);
        let mut joined: String = self.parts.iter().map(|part| format!("{part}\n")).collect();
        joined.push_str(rest);
        joined
    }

    /// The code `EVALSHA` runs: a pool script gets the prelude joined in
    /// after its shebang (Redis reads flags only on the first line) and a
    /// call of its main function. `EVALSHA` makes every closure anew each
    /// call; the body runs in a function of its own, so that its closures
    /// reach the prelude's locals as that function's upvalues, not by Lua
    /// 5.1's linear search of the open upvalues (~80k instructions a call).
    fn eval_code(&self) -> String {
        if !self.pool {
            return self.code.to_owned();
        }
        let (shebang, body) = (self.shebang(), self.body());
        format!(
            "{shebang}\n{}\nreturn (function()\n{body}\nreturn {}(KEYS, ARGV)\nend)()\n",
            prelude(),
            self.name
        )
    }

    /// Its shebang flags as `register_function` takes them.
    fn flags(&self) -> &'static str {
        if self.shebang().contains("flags=no-writes") {
            "{'no-writes'}"
        } else {
            "{}"
        }
    }
}

/// The version of the public contract library, in its name
/// (`proxy_pool_v<N>`) and its functions' (`proxy_pool_v<N>_contract`).
/// It must change whenever a public function's KEYS, ARGV, reply or errors
/// change, or the pool layout ([`keys::LAYOUT`](super::keys::LAYOUT)) does: a caller written
/// for one version then finds no function rather than one that misreads
/// its arguments. Two builds with the same version may replace each
/// other's public library (`FUNCTION LOAD REPLACE`); that is harmless by
/// this rule, since they answer every call the same way.
pub const CONTRACT_VERSION: u32 = 3;

/// The scripts the public library registers (the pool's writer-facing
/// operations; extraction is the HTTP API's, its arguments internal).
const PUBLIC_SCRIPTS: [&str; 4] = ["upsert", "contract", "prune", "inventory"];

/// How a library is named.
enum LibraryName {
    /// `proxy_pool_<12 hex digits of its code's hash>`: one build's own.
    Hashed,
    /// The same for every build that registers this code's contract.
    Fixed(String),
}

/// A function library: its name, its code and its functions.
pub(super) struct Library {
    /// `proxy_pool_<12 hex digits>` or `proxy_pool_v<N>`.
    pub(super) name: String,
    /// The code `FUNCTION LOAD` takes.
    pub(super) code: String,
    /// The functions it registers, `<name>_<script>`, in source order.
    functions: Vec<String>,
}

impl Library {
    /// The prelude at the top level, then `sources`, each registered as
    /// `<name>_<script>` with its shebang's flags.
    fn build(name: LibraryName, sources: &[&Source]) -> Self {
        let mut body = prelude();
        body.push_str("\nlocal MAIN = {}\n");
        for source in sources {
            let code = source.body();
            let name = source.name;
            if source.pool {
                // Its phases and main in a block: their names are its own.
                body.push_str(&format!("\ndo\n{code}\nMAIN.{name} = {name}\nend\n"));
            } else {
                body.push_str(&format!(
                    "\nMAIN.{name} = function(KEYS, ARGV)\n{code}\nend\n"
                ));
            }
        }
        let name = match name {
            // The name follows the code (flags included), so it is hashed
            // before it is named.
            LibraryName::Hashed => {
                let flags: String = sources.iter().map(|s| s.flags()).collect();
                let hash = Script::new(&format!("{body}{flags}")).get_hash().to_owned();
                format!("proxy_pool_{}", &hash[..12])
            }
            LibraryName::Fixed(name) => name,
        };
        let mut code = format!("#!lua name={name}\n{body}");
        let mut functions = Vec::with_capacity(sources.len());
        for source in sources {
            let function = format!("{name}_{}", source.name);
            code.push_str(&format!(
                "redis.register_function{{function_name = '{function}', callback = MAIN.{}, flags = {}}}\n",
                source.name,
                source.flags()
            ));
            functions.push(function);
        }
        Self {
            name,
            code,
            functions,
        }
    }

    /// The `FUNCTION LOAD REPLACE` of this library (REPLACE: a library of
    /// this name has this very code, or, for the public library, code that
    /// answers the same contract version; so a concurrent load is
    /// harmless).
    pub(super) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.code);
        cmd
    }
}

/// The library every script is a function of, private to this build.
pub(super) static LIBRARY: LazyLock<Library> =
    LazyLock::new(|| Library::build(LibraryName::Hashed, &SOURCES.iter().collect::<Vec<_>>()));

/// The public library, `proxy_pool_v<CONTRACT_VERSION>`: the prelude and
/// the writer-facing pool scripts, for programs in other languages.
pub(super) static PUBLIC_LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let sources: Vec<&Source> = PUBLIC_SCRIPTS.iter().map(|name| source(name)).collect();
    Library::build(
        LibraryName::Fixed(format!("proxy_pool_v{CONTRACT_VERSION}")),
        &sources,
    )
});

/// The public contract library's name, `proxy_pool_v<CONTRACT_VERSION>`.
pub fn contract_library() -> &'static str {
    &PUBLIC_LIBRARY.name
}

/// The functions the public contract library registers
/// (`proxy_pool_v<CONTRACT_VERSION>_<script>`), in order: upsert, contract,
/// prune, inventory.
pub fn contract_functions() -> &'static [String] {
    &PUBLIC_LIBRARY.functions
}

/// The source of the script `name` (a name of [`SOURCES`]).
fn source(name: &str) -> &'static Source {
    SOURCES
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no script named {name}"))
}

/// One script: its function in [`LIBRARY`] and its `EVALSHA` twin.
pub(super) struct LuaScript {
    function: String,
    eval: Script,
}

impl LuaScript {
    fn named(name: &str) -> Self {
        let source = source(name);
        Self {
            function: format!("{}_{name}", LIBRARY.name),
            eval: Script::new(&source.eval_code()),
        }
    }

    /// Loads the `EVALSHA` twin (`SCRIPT LOAD`).
    pub(super) async fn load_async(
        &self,
        conn: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> redis::RedisResult<String> {
        self.eval.load_async(conn).await
    }

    /// A call of this script, keys and arguments to be added.
    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`LuaScript`]: its keys and arguments, sent as `FCALL`
/// or, where Functions are refused, as `EVALSHA`.
pub(super) struct Invocation<'a> {
    script: &'a LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Adds a key (`KEYS[n]`).
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Appends `bytes` to the argument at `index` (0-based; a missing one
    /// is left alone).
    pub(super) fn append_to_arg(&mut self, index: usize, bytes: &[u8]) {
        if let Some(arg) = self.args.get_mut(index) {
            arg.extend_from_slice(bytes);
        }
    }

    /// The `FCALL` of this call (routed in a cluster by its first key).
    pub(super) fn fcall_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.script.function)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// The same call by `EVALSHA` (loaded on `NOSCRIPT` by redis-rs).
    pub(super) fn eval(&self) -> ScriptInvocation<'_> {
        let mut inv = self.script.eval.prepare_invoke();
        for key in &self.keys {
            inv.key(key);
        }
        for arg in &self.args {
            inv.arg(arg);
        }
        inv
    }
}

/// `lua/extract.lua`.
pub(super) static EXTRACT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("extract"));
/// `lua/upsert.lua`.
pub(super) static UPSERT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("upsert"));
/// `lua/contract.lua`.
pub(super) static CONTRACT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("contract"));
/// `lua/prune.lua`.
pub(super) static PRUNE: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("prune"));
/// `lua/inventory.lua`.
pub(super) static INVENTORY: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("inventory"));
/// `lua/ratelimit.lua` (not a pool-index script: no prelude).
pub(super) static RATELIMIT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::named("ratelimit"));
/// `lua/usage_backlog.lua` (read only, no pool keys: no prelude).
pub(super) static USAGE_BACKLOG: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::named("usage_backlog"));
/// `lua/client_lookup.lua` (the Redis client registry: no prelude).
pub(super) static CLIENT_LOOKUP: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::named("client_lookup"));
/// `lua/client_put.lua`.
pub(super) static CLIENT_PUT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::named("client_put"));
/// `lua/client_revoke.lua`.
pub(super) static CLIENT_REVOKE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::named("client_revoke"));

/// How `SLOWLOG` and `MONITOR` name `lua/extract.lua`'s calls: the
/// function `FCALL` calls, and the SHA-1 of its `EVALSHA` twin (prelude
/// joined in), so a reader can tell its calls from the other scripts'.
pub fn extract_names() -> [&'static str; 2] {
    [EXTRACT.function.as_str(), EXTRACT.eval.get_hash()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shebang stays the first line (Redis reads flags only there) and
    /// every pool script sees the prelude, its keys bound first.
    #[test]
    fn prelude_joins_after_the_shebang() {
        for source in SOURCES.iter().filter(|s| s.pool) {
            let code = source.eval_code();
            assert!(code.starts_with("#!lua"), "{}", &code[..20]);
            assert_eq!(code.lines().next(), source.code.lines().next());
            assert!(code.contains("local function bind_keys"));
            assert!(code.ends_with(&format!("\nreturn {}(KEYS, ARGV)\nend)()\n", source.name)));
        }
    }

    /// The library names itself after its code and registers every script
    /// once, read-only ones with `no-writes`.
    #[test]
    fn library_registers_every_script() {
        let lib = &*LIBRARY;
        assert!(lib.code.starts_with(&format!("#!lua name={}\n", lib.name)));
        for source in &SOURCES {
            let line = format!("function_name = '{}_{}'", lib.name, source.name);
            assert_eq!(lib.code.matches(&line).count(), 1, "{line}");
        }
        assert!(
            lib.code
                .contains("_inventory', callback = MAIN.inventory, flags = {'no-writes'}")
        );
        assert!(
            lib.code
                .contains("_extract', callback = MAIN.extract, flags = {}")
        );
    }

    /// The public library is named by the contract version alone and
    /// registers the four writer-facing scripts once each (inventory still
    /// `no-writes`), over the same prelude; extraction stays private.
    #[test]
    fn public_library_registers_the_contract() {
        let lib = &*PUBLIC_LIBRARY;
        // Version 1 is what docs/pool-contract.md documents: a new version
        // changes both.
        assert_eq!(contract_library(), "proxy_pool_v3");
        assert!(lib.code.starts_with("#!lua name=proxy_pool_v3\n"));
        assert_eq!(
            contract_functions(),
            [
                "proxy_pool_v3_upsert",
                "proxy_pool_v3_contract",
                "proxy_pool_v3_prune",
                "proxy_pool_v3_inventory"
            ]
        );
        for function in contract_functions() {
            let line = format!("function_name = '{function}'");
            assert_eq!(lib.code.matches(&line).count(), 1, "{line}");
        }
        assert_eq!(lib.code.matches("function_name = ").count(), 4);
        assert!(lib.code.contains(
            "'proxy_pool_v3_inventory', callback = MAIN.inventory, flags = {'no-writes'}"
        ));
        assert!(
            lib.code
                .contains("'proxy_pool_v3_upsert', callback = MAIN.upsert, flags = {}")
        );
        assert!(!lib.code.contains("MAIN.extract"));
        assert!(lib.code.contains("local function bind_keys"));
        assert_ne!(LIBRARY.name, lib.name);
    }
}
