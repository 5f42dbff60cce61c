//! plugio-macros: `#[plugio::main]` and `#[plugio::test]`, re-exported by
//! the `plugio` crate (use them from there: they expand to `::plugio::...`
//! paths).
//!
//! Both turn an `async fn` into a plain one that builds a plugio runtime
//! with the device driver installed (so `Device` IO works) and runs the
//! body on it, the way tokio's `#[tokio::main]` and `#[tokio::test]` do.
//!
//! # Arguments (all optional, `name = literal`, comma separated)
//!
//! | argument | default | what |
//! |---|---|---|
//! | `cores = N` | absent | absent: one core on the calling thread (`plugio::runtime::local`). `N`: a runtime of `N` core threads (`plugio::runtime::builder`); the body runs on core 0 and must then be `Send + 'static` |
//! | `max_blocking_threads = N` | 512 | bound of the runtime's `spawn_blocking` pool |
//! | `sq_entries = N` | 256 | `RingConfig::sq_entries` |
//! | `cq_entries = N` | twice the SQ | `RingConfig::cq_entries` |
//! | `taskrun_flags = bool` | `true` | `RingConfig::taskrun_flags` |
//! | `sqpoll_idle_ms = N` | off | `RingConfig::sqpoll_idle_ms` |
//! | `iopoll = bool` | `false` | `RingConfig::iopoll` |
//! | `registered_files = N` | 64 | `RingConfig::registered_files` |
//! | `batch_wait_us = N` | 100 | `RingConfig::batch_wait`, in microseconds |
//! | `batch_wait_timer = "always"` | `"when_late"` | `RingConfig::batch_wait_timer`: `"always"` is `BatchWaitTimer::Always`, `"when_late"` `BatchWaitTimer::WhenLate` |
//! | `timeout_s = N` | 60 | `#[plugio::test]` only: the watchdog. The test runs on its own thread; if it has not finished after `N` seconds it fails ("did not finish within N s") instead of hanging the suite |
//! | `crate = "path"` | `"plugio"` | where the `plugio` crate is, when it was renamed |
//!
//! A bad argument is a compile error that names it and says what is
//! expected:
//!
//! ```compile_fail
//! #[plugio::test(corse = 2)] // error: unknown argument `corse`; expected one of: cores, ...
//! async fn typo() {}
//! ```
//!
//! ```compile_fail
//! #[plugio::main(timeout_s = 5)] // error: `timeout_s` is only for #[plugio::test]
//! async fn main() {}
//! ```
//!
//! ```compile_fail
//! #[plugio::test]
//! fn not_async() {} // error: the `async` keyword is missing from the function declaration
//! ```

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, MetaNameValue, Token};

/// Runs an `async fn main` on a plugio runtime with the device driver
/// installed; its output is `main`'s (a `Result` works as usual).
///
/// ```
/// #[plugio::main]
/// async fn main() -> Result<(), plugio::Error> {
///     let n = plugio::spawn(async { 20 + 22 }).await.unwrap();
///     assert_eq!(n, 42);
///     Ok(())
/// }
/// ```
///
/// With arguments (see the crate docs for the list): four cores, a deeper
/// submission queue.
///
/// ```
/// #[plugio::main(cores = 4, sq_entries = 512)]
/// async fn main() {
///     let h = plugio::executor::Handle::current().expect("on a core");
///     assert_eq!(h.cores(), 4);
/// }
/// ```
///
/// Without `cores`, the body runs on the calling thread
/// (`plugio::runtime::local`) and need not be `Send`.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Main, args.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Makes an `async fn` a `#[test]` that runs on a fresh plugio runtime with
/// the device driver installed, on its own thread, under a watchdog: a test
/// still running after `timeout_s` seconds (default 60) fails with "did
/// not finish within N s" instead of hanging the suite. Panics and
/// `#[should_panic]` behave as in a plain test; a test may return a
/// `Result`.
///
/// ```
/// #[plugio::test(timeout_s = 10)]
/// async fn spawn_blocking_works() {
///     let n = plugio::spawn_blocking(|| 6 * 7).await.unwrap();
///     assert_eq!(n, 42);
/// }
/// ```
///
/// ```
/// #[plugio::test(cores = 2, iopoll = false)]
/// async fn two_cores() -> Result<(), Box<dyn std::error::Error>> {
///     let h = plugio::executor::Handle::current().ok_or("no runtime")?;
///     assert_eq!(h.cores(), 2);
///     Ok(())
/// }
/// ```
///
/// (A doctest is not built with `--test`, so the two examples above only
/// compile there; `tests/macros.rs` of the `plugio` crate runs them, the
/// watchdog included.)
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Test, args.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Main,
    Test,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Main => "#[plugio::main]",
            Kind::Test => "#[plugio::test]",
        }
    }
}

/// Every argument, for the "expected one of" message.
const ARGS: &[&str] = &[
    "cores",
    "max_blocking_threads",
    "sq_entries",
    "cq_entries",
    "taskrun_flags",
    "sqpoll_idle_ms",
    "iopoll",
    "registered_files",
    "batch_wait_us",
    "batch_wait_timer",
    "timeout_s",
    "crate",
];

/// The default watchdog of `#[plugio::test]`, in seconds.
const DEFAULT_TIMEOUT_S: u64 = 60;

/// The parsed arguments.
struct Config {
    cores: Option<u64>,
    max_blocking_threads: Option<u64>,
    /// `RingConfig` field initialisers.
    ring: Vec<TokenStream2>,
    /// `batch_wait_timer`: `Some(true)` for `"always"` (a path in the
    /// `plugio` crate, built once the crate path is known).
    batch_wait_always: Option<bool>,
    timeout_s: u64,
    krate: syn::Path,
}

fn parse_args(kind: Kind, args: TokenStream2) -> syn::Result<Config> {
    let parsed = Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse2(args)?;
    let mut config = Config {
        cores: None,
        max_blocking_threads: None,
        ring: Vec::new(),
        batch_wait_always: None,
        timeout_s: DEFAULT_TIMEOUT_S,
        krate: syn::parse_quote!(::plugio),
    };
    let mut seen: Vec<String> = Vec::new();
    for arg in parsed {
        let name = arg
            .path
            .get_ident()
            .map(ToString::to_string)
            .or_else(|| arg.path.is_ident("crate").then(|| "crate".to_owned()))
            .unwrap_or_else(|| arg.path.to_token_stream().to_string());
        if seen.contains(&name) {
            return Err(syn::Error::new(
                arg.path.span(),
                format!("`{name}` is given twice"),
            ));
        }
        seen.push(name.clone());
        apply(kind, &mut config, &name, &arg)?;
    }
    Ok(config)
}

/// Applies one `name = value` argument.
fn apply(kind: Kind, config: &mut Config, name: &str, arg: &MetaNameValue) -> syn::Result<()> {
    let value = &arg.value;
    match name {
        "cores" => config.cores = Some(positive(name, value)?),
        "max_blocking_threads" => config.max_blocking_threads = Some(positive(name, value)?),
        "timeout_s" if kind == Kind::Main => {
            return Err(syn::Error::new(
                arg.path.span(),
                "`timeout_s` is only for #[plugio::test] (a watchdog for tests); remove it from #[plugio::main]",
            ))
        }
        "timeout_s" => config.timeout_s = positive(name, value)?,
        "sq_entries" | "registered_files" => {
            let n = u32_arg(name, value, name == "registered_files")?;
            let field = syn::Ident::new(name, Span::call_site());
            config.ring.push(quote!(#field: #n));
        }
        "cq_entries" | "sqpoll_idle_ms" => {
            let n = u32_arg(name, value, name == "sqpoll_idle_ms")?;
            let field = syn::Ident::new(name, Span::call_site());
            config
                .ring
                .push(quote!(#field: ::core::option::Option::Some(#n)));
        }
        "taskrun_flags" | "iopoll" => {
            let b = bool_arg(name, value)?;
            let field = syn::Ident::new(name, Span::call_site());
            config.ring.push(quote!(#field: #b));
        }
        "batch_wait_us" => {
            let us = int_arg(name, value)?;
            config
                .ring
                .push(quote!(batch_wait: ::std::time::Duration::from_micros(#us)));
        }
        "batch_wait_timer" => {
            let timer = match value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) => s.value(),
                _ => String::new(),
            };
            config.batch_wait_always = match timer.as_str() {
                "always" => Some(true),
                "when_late" => Some(false),
                _ => {
                    return Err(syn::Error::new(
                        value.span(),
                        "`batch_wait_timer` takes \"always\" or \"when_late\"",
                    ))
                }
            };
        }
        "crate" => {
            let Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) = value
            else {
                return Err(syn::Error::new(
                    value.span(),
                    "`crate` takes a path in a string, e.g. `crate = \"my_plugio\"`",
                ));
            };
            config.krate = s.parse()?;
        }
        _ => {
            return Err(syn::Error::new(
                arg.path.span(),
                format!(
                    "unknown argument `{name}` of {}; expected one of: {}",
                    kind.name(),
                    ARGS.join(", ")
                ),
            ))
        }
    }
    Ok(())
}

fn int_arg(name: &str, value: &Expr) -> syn::Result<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse::<u64>(),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{name}` takes an integer literal, e.g. `{name} = 4`"),
        )),
    }
}

fn positive(name: &str, value: &Expr) -> syn::Result<u64> {
    let n = int_arg(name, value)?;
    if n == 0 {
        return Err(syn::Error::new(
            value.span(),
            format!("`{name}` must be at least 1"),
        ));
    }
    Ok(n)
}

fn u32_arg(name: &str, value: &Expr, zero_ok: bool) -> syn::Result<u32> {
    let n = if zero_ok {
        int_arg(name, value)?
    } else {
        positive(name, value)?
    };
    u32::try_from(n).map_err(|_| {
        syn::Error::new(
            value.span(),
            format!("`{name}` must fit in 32 bits (at most {})", u32::MAX),
        )
    })
}

fn bool_arg(name: &str, value: &Expr) -> syn::Result<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(b.value),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{name}` takes `true` or `false`"),
        )),
    }
}

/// Checks the function's shape.
fn check_fn(kind: Kind, f: &ItemFn) -> syn::Result<()> {
    if f.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            f.sig.fn_token.span(),
            format!(
                "the `async` keyword is missing from the function declaration ({} runs an async fn)",
                kind.name()
            ),
        ));
    }
    if !f.sig.inputs.is_empty() {
        return Err(syn::Error::new(
            f.sig.inputs.span(),
            format!("{} functions take no arguments", kind.name()),
        ));
    }
    if !f.sig.generics.params.is_empty() || f.sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            f.sig.generics.span(),
            format!("{} functions cannot be generic", kind.name()),
        ));
    }
    if kind == Kind::Test {
        if let Some(attr) = f.attrs.iter().find(|a| a.path().is_ident("test")) {
            return Err(syn::Error::new(
                attr.span(),
                "#[plugio::test] already makes the function a #[test]; remove this #[test]",
            ));
        }
    }
    Ok(())
}

/// The `Settings` value the support functions take.
fn settings(config: &Config) -> TokenStream2 {
    let krate = &config.krate;
    let mut ring = config.ring.clone();
    if let Some(always) = config.batch_wait_always {
        let timer = if always {
            quote!(Always)
        } else {
            quote!(WhenLate)
        };
        ring.push(quote!(batch_wait_timer: #krate::BatchWaitTimer::#timer));
    }
    let cores = match config.cores {
        Some(n) => {
            let n = n as usize;
            quote!(::core::option::Option::Some(#n))
        }
        None => quote!(::core::option::Option::None),
    };
    let blocking = match config.max_blocking_threads {
        Some(n) => {
            let n = n as usize;
            quote!(::core::option::Option::Some(#n))
        }
        None => quote!(::core::option::Option::None),
    };
    quote! {
        #krate::__macro_support::Settings {
            cores: #cores,
            max_blocking_threads: #blocking,
            ring: #krate::RingConfig {
                #(#ring,)*
                ..::core::default::Default::default()
            },
        }
    }
}

fn expand(kind: Kind, args: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let config = parse_args(kind, args)?;
    let f: ItemFn = syn::parse2(item)?;
    check_fn(kind, &f)?;
    let krate = &config.krate;
    let settings = settings(&config);
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = f;
    let name = &sig.ident;
    let output = &sig.output;
    let inner = quote_spanned! {sig.span()=>
        async fn __plugio_body() #output #block
    };
    let run = if config.cores.is_some() {
        quote!(#krate::__macro_support::block_on_cores)
    } else {
        quote!(#krate::__macro_support::block_on_local)
    };
    match kind {
        Kind::Main => Ok(quote! {
            #(#attrs)*
            #vis fn #name() #output {
                #inner
                #run(#settings, __plugio_body())
            }
        }),
        Kind::Test => {
            let timeout_s = config.timeout_s;
            let name_str = name.to_string();
            let (ret, report) = match output {
                syn::ReturnType::Default => (quote!(), quote!(out)),
                syn::ReturnType::Type(..) => (
                    quote!(-> ::std::process::ExitCode),
                    quote!(::std::process::Termination::report(out)),
                ),
            };
            Ok(quote! {
                #[::core::prelude::v1::test]
                #(#attrs)*
                #vis fn #name() #ret {
                    #inner
                    #krate::__macro_support::watchdog(#name_str, #timeout_s, move || {
                        let out = #run(#settings, __plugio_body());
                        #report
                    })
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    //! The argument errors, by message (the compile-fail doctests above
    //! show they stop the build).

    use super::*;

    fn error(kind: Kind, args: &str, item: &str) -> String {
        let args: TokenStream2 = args.parse().expect("args tokens");
        let item: TokenStream2 = item.parse().expect("item tokens");
        match expand(kind, args, item) {
            Ok(out) => panic!("expected an error, got {out}"),
            Err(e) => e.to_string(),
        }
    }

    #[::core::prelude::v1::test]
    fn unknown_argument_names_it_and_lists_the_known_ones() {
        let msg = error(Kind::Test, "corse = 2", "async fn t() {}");
        assert!(msg.contains("unknown argument `corse`"), "{msg}");
        assert!(msg.contains("expected one of: cores,"), "{msg}");
    }

    #[::core::prelude::v1::test]
    fn wrong_value_types_say_what_is_expected() {
        let msg = error(Kind::Main, "cores = \"four\"", "async fn main() {}");
        assert_eq!(msg, "`cores` takes an integer literal, e.g. `cores = 4`");
        let msg = error(Kind::Test, "iopoll = 1", "async fn t() {}");
        assert_eq!(msg, "`iopoll` takes `true` or `false`");
        let msg = error(Kind::Test, "cores = 0", "async fn t() {}");
        assert_eq!(msg, "`cores` must be at least 1");
        let msg = error(Kind::Test, "sq_entries = 5000000000", "async fn t() {}");
        assert!(msg.contains("must fit in 32 bits"), "{msg}");
        let msg = error(Kind::Test, "crate = plugio", "async fn t() {}");
        assert!(msg.contains("takes a path in a string"), "{msg}");
    }

    #[::core::prelude::v1::test]
    fn misplaced_and_repeated_arguments_are_refused() {
        let msg = error(Kind::Main, "timeout_s = 5", "async fn main() {}");
        assert!(msg.contains("only for #[plugio::test]"), "{msg}");
        let msg = error(Kind::Test, "cores = 1, cores = 2", "async fn t() {}");
        assert_eq!(msg, "`cores` is given twice");
    }

    #[::core::prelude::v1::test]
    fn the_function_must_be_async_without_arguments_or_a_second_test_attribute() {
        let msg = error(Kind::Test, "", "fn t() {}");
        assert!(msg.contains("`async` keyword is missing"), "{msg}");
        let msg = error(Kind::Main, "", "async fn main(x: u32) {}");
        assert_eq!(msg, "#[plugio::main] functions take no arguments");
        let msg = error(Kind::Test, "", "async fn t<T>() {}");
        assert_eq!(msg, "#[plugio::test] functions cannot be generic");
        let msg = error(Kind::Test, "", "#[test] async fn t() {}");
        assert!(msg.contains("remove this #[test]"), "{msg}");
    }

    #[::core::prelude::v1::test]
    fn good_arguments_expand_to_the_support_calls() {
        let args: TokenStream2 =
            "cores = 2, sq_entries = 64, iopoll = true, batch_wait_us = 0, timeout_s = 7, batch_wait_timer = \"always\""
                .parse()
                .expect("args");
        let item: TokenStream2 = "async fn t() -> Result<(), String> { Ok(()) }"
            .parse()
            .expect("item");
        let out = expand(Kind::Test, args, item).expect("expands").to_string();
        assert!(out.contains("block_on_cores"), "{out}");
        assert!(out.contains("sq_entries : 64u32"), "{out}");
        assert!(out.contains("iopoll : true"), "{out}");
        assert!(out.contains("from_micros (0u64)"), "{out}");
        assert!(out.contains("BatchWaitTimer :: Always"), "{out}");
        assert!(out.contains("watchdog (\"t\" , 7u64"), "{out}");
        assert!(out.contains("ExitCode"), "{out}");
        let out = expand(
            Kind::Main,
            TokenStream2::new(),
            "async fn main() {}".parse().expect("item"),
        )
        .expect("expands")
        .to_string();
        assert!(out.contains("block_on_local"), "{out}");
    }
}
