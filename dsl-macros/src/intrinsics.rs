//! The DSL's vocabulary: which calls a kernel may make and how their generic arguments work.
//!
//! The intrinsics are not listed here: they are read from dsl-core's own source, so that an
//! intrinsic is defined once, as a `pub fn` in `dsl-core/src/intrinsics.rs`, and the macro (call
//! rewriting, shape checks, error text) follows. `include_str!` makes cargo rebuild this crate when
//! that file changes. What the table takes from each `pub fn`:
//!
//! - its generic parameters in order (lifetimes aside): a `const` one is a tile shape (must be a
//!   compile-time constant), a type one an element type (a tile size written there is a mistake);
//! - whether its first parameter is the context (`&mut Ctx`); pure scalar helpers like `cdiv` take
//!   none and are called as written;
//! - how it is written in a kernel, for messages: the doc line `Usage: `...`` if it has one, else a
//!   form built from the signature.

use std::sync::OnceLock;
use syn::{FnArg, GenericParam, Item, ItemFn, Pat, Type, Visibility};

/// The single source of the intrinsics (path relative to this file).
const SOURCE: &str = include_str!("../../dsl-core/src/intrinsics.rs");

/// The file named in messages about [`SOURCE`].
const SOURCE_NAME: &str = "dsl-core/src/intrinsics.rs";

/// An intrinsic the macro rewrites to `::dsl_core::intrinsics::NAME(ctx, ...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intrinsic {
    /// Name as written in kernels.
    pub name: String,
    /// Generic parameters of the dsl-core function (types and consts; the turbofish is completed
    /// with `_` up to this many).
    pub generics: usize,
    /// Indices (among the generic arguments, in the function's order) that are tile shapes and must
    /// be constant.
    pub shape_args: Vec<usize>,
    /// Indices (among the generic arguments) that are element types: a tile size written there is a
    /// mistake worth its own message.
    pub type_args: Vec<usize>,
    /// How the call is written, for messages.
    pub usage: String,
    /// Whether the intrinsic takes the context (false for pure scalar helpers like `cdiv`).
    pub takes_ctx: bool,
}

/// All intrinsics, in the order of dsl-core's source (derived once per compiler process).
pub fn all() -> &'static [Intrinsic] {
    static TABLE: OnceLock<Vec<Intrinsic>> = OnceLock::new();
    TABLE.get_or_init(|| derive(SOURCE).unwrap_or_else(|e| panic!("#[kernel]: {e}")))
}

/// Looks an intrinsic up by name.
pub fn find(name: &str) -> Option<&'static Intrinsic> {
    all().iter().find(|i| i.name == name)
}

/// Every intrinsic's name, for error messages (complete by construction).
pub fn summary() -> String {
    all()
        .iter()
        .map(|i| i.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The intrinsics declared in `src` (the text of dsl-core's intrinsics module): one per `pub fn`.
///
/// An item-level macro call or a `pub use` there could declare intrinsics this reading cannot see,
/// so either is refused rather than silently missed.
pub fn derive(src: &str) -> Result<Vec<Intrinsic>, String> {
    let file = syn::parse_file(src).map_err(|e| format!("cannot parse {SOURCE_NAME}: {e}"))?;
    let mut out = Vec::new();
    for item in &file.items {
        match item {
            Item::Fn(f) if matches!(f.vis, Visibility::Public(_)) => out.push(from_fn(f)),
            Item::Macro(m) if m.ident.is_none() => {
                let path = &m.mac.path;
                return Err(format!(
                    "{SOURCE_NAME} invokes `{}!` at item level; intrinsics are read from its plain `pub fn`s, so write each one out",
                    quote::quote!(#path)
                ));
            }
            Item::Use(u) if !matches!(u.vis, Visibility::Inherited) => {
                return Err(format!(
                    "{SOURCE_NAME} re-exports with `pub use`; intrinsics are read from its plain `pub fn`s, so define them there"
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

fn from_fn(f: &ItemFn) -> Intrinsic {
    let sig = &f.sig;
    let name = sig.ident.to_string();
    let (mut shape_args, mut type_args, mut gen_names) = (Vec::new(), Vec::new(), Vec::new());
    for g in &sig.generics.params {
        let idx = gen_names.len();
        match g {
            GenericParam::Const(c) => {
                shape_args.push(idx);
                gen_names.push(c.ident.to_string());
            }
            GenericParam::Type(t) => {
                type_args.push(idx);
                gen_names.push(t.ident.to_string());
            }
            // Lifetimes are never written in a kernel's turbofish.
            GenericParam::Lifetime(_) => {}
        }
    }
    let takes_ctx = sig.inputs.first().is_some_and(is_ctx);
    let usage = doc_usage(f).unwrap_or_else(|| {
        let params: Vec<String> = sig
            .inputs
            .iter()
            .skip(takes_ctx as usize)
            .map(param_form)
            .collect();
        let turbofish = if gen_names.is_empty() {
            String::new()
        } else {
            format!("::<{}>", gen_names.join(", "))
        };
        format!("{name}{turbofish}({})", params.join(", "))
    });
    Intrinsic {
        name,
        generics: gen_names.len(),
        shape_args,
        type_args,
        usage,
        takes_ctx,
    }
}

/// Whether a parameter is the execution context, `&mut Ctx`.
fn is_ctx(arg: &FnArg) -> bool {
    let FnArg::Typed(pt) = arg else { return false };
    let Type::Reference(r) = &*pt.ty else {
        return false;
    };
    r.mutability.is_some()
        && matches!(&*r.elem, Type::Path(tp) if tp.path.segments.last().is_some_and(|s| s.ident == "Ctx"))
}

/// A parameter as an argument in a call: its name, behind `&`/`&mut ` when passed by reference.
fn param_form(arg: &FnArg) -> String {
    let FnArg::Typed(pt) = arg else {
        return "self".into();
    };
    let name = match &*pt.pat {
        Pat::Ident(pi) => pi.ident.to_string(),
        _ => "_".into(),
    };
    match &*pt.ty {
        Type::Reference(r) if r.mutability.is_some() => format!("&mut {name}"),
        Type::Reference(_) => format!("&{name}"),
        _ => name,
    }
}

/// The form in a doc line `Usage: `...``, if the function has one.
fn doc_usage(f: &ItemFn) -> Option<String> {
    f.attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .find_map(|line| {
            let rest = line.trim().strip_prefix("Usage:")?.trim();
            let inner = rest.strip_prefix('`')?;
            Some(inner[..inner.find('`')?].to_string())
        })
}

/// Methods kernels may call on scalars and tensors (no data-dependent behaviour, no allocation).
/// These are Rust methods, not intrinsics, so they are listed here.
pub const METHODS: &[&str] = &[
    "at",
    "rows_clipped",
    "cols_clipped",
    "rows",
    "cols",
    "shape",
    "len",
    "is_empty",
    "min",
    "max",
    "step_by",
    "rev",
    "sqrt",
    "powi",
    "powf",
    "abs",
    "exp",
    "ln",
    "saturating_sub",
    "div_ceil",
    "clamp",
    "recip",
];

/// Primitive types whose associated functions and constants kernels may use (`f32::NEG_INFINITY`,
/// `usize::min(a, b)`).
pub const PRIMITIVES: &[&str] = &["f32", "f64", "usize", "u32", "u64", "i32", "i64", "isize"];

#[cfg(test)]
mod tests {
    use super::*;

    fn get(name: &str) -> &'static Intrinsic {
        find(name).unwrap_or_else(|| panic!("`{name}` missing from the derived table"))
    }

    /// Every `pub fn` of the source, found by a plain text scan (independent of the syn reading).
    fn pub_fns_by_text() -> Vec<String> {
        SOURCE
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix("pub fn ")
                    .or_else(|| l.strip_prefix("pub const fn "))?;
                let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
                Some(rest[..end].to_string())
            })
            .collect()
    }

    #[test]
    fn every_pub_fn_is_an_intrinsic_and_in_the_summary() {
        let names = pub_fns_by_text();
        assert!(names.len() >= 55, "only {} pub fns found", names.len());
        let summary = summary();
        let listed: Vec<&str> = summary.split(", ").collect();
        for n in &names {
            get(n);
            assert!(listed.contains(&n.as_str()), "`{n}` missing from summary");
        }
        assert_eq!(all().len(), names.len(), "table and source disagree");
    }

    #[test]
    fn generic_arguments_are_classified() {
        let load = get("load");
        assert_eq!(
            (load.generics, &load.shape_args[..], &load.type_args[..]),
            (3, &[0, 1][..], &[2][..])
        );
        assert!(load.takes_ctx);
        let zeros = get("zeros");
        assert_eq!(
            (zeros.generics, &zeros.shape_args[..], &zeros.type_args[..]),
            (3, &[1, 2][..], &[0][..])
        );
        let dq = get("dequant_mxfp4");
        assert_eq!(
            (dq.generics, &dq.shape_args[..], &dq.type_args[..]),
            (5, &[1, 2, 3, 4][..], &[0][..])
        );
        let cast = get("cast");
        assert_eq!(
            (&cast.shape_args[..], &cast.type_args[..]),
            (&[2, 3][..], &[0, 1][..])
        );
        let cdiv = get("cdiv");
        assert!(!cdiv.takes_ctx);
        assert_eq!(cdiv.generics, 0);
        assert!(get("program_id").takes_ctx);
    }

    #[test]
    fn usage_comes_from_the_doc_or_the_signature() {
        assert_eq!(get("load").usage, "load::<R, C>(tensor, row, col)");
        assert_eq!(get("zeros").usage, "zeros::<f32, R, C>()");
        // No `Usage:` line: built from the signature, context left out.
        assert_eq!(get("mma").usage, "mma::<T, M, N, K>(&mut acc, &a, &b)");
        assert_eq!(get("cdiv").usage, "cdiv(a, b)");
    }

    #[test]
    fn hidden_declarations_are_refused() {
        assert!(derive("unary_intrinsics! { exp => Exp; }").is_err());
        assert!(derive("pub use other::load;").is_err());
        // Private helpers and macro definitions are not intrinsics.
        let t = derive("fn helper() {} macro_rules! m { () => {} } pub fn x(ctx: &mut Ctx) {}")
            .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "x");
    }
}
