//! The companion module `#[kernel]` generates next to the kernel: `META` and `launch`.

use crate::parse::attr::{KernelAttr, Tunable};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{FnArg, GenericParam, ItemFn, Pat};

/// The kernel's parameters (receivers are rejected by validation and skipped here).
fn typed_params(func: &ItemFn) -> Vec<&syn::PatType> {
    func.sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            FnArg::Typed(pt) => Some(pt),
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// The `META` constant: name, parameter names, tunable space and source lines (empty for a stub).
fn meta_const(
    func: &ItemFn,
    tunables: &[Tunable],
    lines: &[(u32, String)],
    constrained: Option<(&[Vec<i64>], &[syn::Expr])>,
) -> TokenStream {
    let name_str = func.sig.ident.to_string();
    let param_names: Vec<String> = typed_params(func)
        .iter()
        .map(|pt| match &*pt.pat {
            Pat::Ident(pi) => pi.ident.to_string(),
            other => quote!(#other).to_string(),
        })
        .collect();
    let tun_names: Vec<String> = tunables.iter().map(|t| t.name.to_string()).collect();
    let tun_values: Vec<&Vec<i64>> = tunables.iter().map(|t| &t.values).collect();
    let line_nums: Vec<u32> = lines.iter().map(|(l, _)| *l).collect();
    let line_texts: Vec<&String> = lines.iter().map(|(_, t)| t).collect();
    // A constrained space lists its points (tunable values only); an unconstrained one is the
    // full product and lists none.
    let (points, constraint_texts): (Vec<&[i64]>, Vec<String>) = match constrained {
        Some((space, exprs)) if !exprs.is_empty() => (
            space.iter().map(|p| &p[..tunables.len()]).collect(),
            exprs.iter().map(|e| quote!(#e).to_string()).collect(),
        ),
        _ => (Vec::new(), Vec::new()),
    };
    // FNV-1a over the item's tokens as written: stable across compilers, unlike std's hasher.
    let source_hash = quote!(#func)
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
    quote! {
        /// Name, parameters, tunable space and source lines of this kernel.
        pub const META: ::dsl_core::KernelMeta = ::dsl_core::KernelMeta {
            name: #name_str,
            params: &[#(#param_names),*],
            tunables: &[#((#tun_names, &[#(#tun_values),*])),*],
            points: &[#(&[#(#points),*]),*],
            constraints: &[#(#constraint_texts),*],
            lines: &[#((#line_nums, #line_texts)),*],
            file: file!(),
            source_hash: #source_hash,
        };
    }
}

/// The companion module of a kernel that failed validation: same `META` shape and `launch`
/// signature, unreachable body. Callers keep compiling while the reported error is fixed.
pub fn stub_companion(func: &ItemFn, tunables: &[Tunable]) -> TokenStream {
    let name = &func.sig.ident;
    let name_str = name.to_string();
    let vis = &func.vis;
    let params = typed_params(func);
    let meta = meta_const(func, tunables, &[], None);
    let generics = &func.sig.generics;
    let gen_params = &generics.params;
    let where_clause = &generics.where_clause;
    let helper_mod = format_ident!("{}", name);
    quote! {
        #[allow(non_snake_case, dead_code, unused_variables, clippy::all)]
        #vis mod #helper_mod {
            #[allow(unused_imports)]
            use super::*;

            #meta

            pub fn launch<#gen_params>(
                __launcher: &::dsl_core::Launcher,
                __config: &::dsl_core::Config,
                #(#params),*
            ) -> ::core::result::Result<::dsl_core::Launch, ::dsl_core::SimError> #where_clause {
                ::core::unreachable!("`{}` did not compile", #name_str)
            }
        }
    }
}

/// `pub mod <name> { pub const META; pub fn launch(...) }`.
///
/// `space` holds every point of the tunable space with the derived constants appended
/// (see [`super::derived::space`]).
pub fn companion(
    func: &ItemFn,
    attr: &KernelAttr,
    space: &[Vec<i64>],
    lines: &[(u32, String)],
) -> TokenStream {
    let name = &func.sig.ident;
    let name_str = name.to_string();
    let vis = &func.vis;
    let params = typed_params(func);
    let param_idents: Vec<&syn::Ident> = params
        .iter()
        .filter_map(|pt| match &*pt.pat {
            Pat::Ident(pi) => Some(&pi.ident),
            _ => None,
        })
        .collect();
    let tun_names: Vec<String> = attr.tunables.iter().map(|t| t.name.to_string()).collect();
    let meta = meta_const(
        func,
        &attr.tunables,
        lines,
        Some((space, &attr.constraints)),
    );

    let generics = &func.sig.generics;
    let (_, _, where_clause) = generics.split_for_impl();
    let type_params: Vec<&syn::Ident> = generics
        .params
        .iter()
        .filter_map(|g| match g {
            GenericParam::Type(t) => Some(&t.ident),
            _ => None,
        })
        .collect();
    let gen_params = &generics.params;

    // One match arm per point of the tunable space, each calling a monomorphised kernel.
    let n_tunables = attr.tunables.len();
    let grid = attr.grid.as_ref().expect("kernels have a grid (checked)");
    let tun_idents: Vec<&syn::Ident> = attr
        .tunables
        .iter()
        .map(|t| &t.name)
        .chain(attr.derived.iter().map(|(n, _)| n))
        .collect();
    let arms = space.iter().map(|combo| {
        let pats = combo[..n_tunables].iter().map(|v| quote!(#v));
        let usz: Vec<usize> = combo.iter().map(|v| *v as usize).collect();
        let consts = tun_idents.iter().zip(&usz).map(|(n, v)| quote!(#[allow(non_upper_case_globals, dead_code)] const #n: usize = #v;));
        quote! {
            (#(#pats,)*) => {
                #(#consts)*
                let __grid = ::dsl_core::IntoGrid::into_grid(#grid);
                __launcher.run_keyed(
                    &META,
                    &__config,
                    __grid,
                    &|__key: &mut ::dsl_core::ArgKey| { #(::dsl_core::LaunchArg::describe(&#param_idents, __key);)* },
                    &|__ctx: &mut ::dsl_core::Ctx| super::#name::<#(#type_params,)* #(#usz),*>(__ctx, #(#param_idents),*),
                )
            }
        }
    });
    let getters = tun_names
        .iter()
        .map(|n| quote!(__config.get(#n).expect("resolved config has every tunable")));
    let doc_launch = format!("Launches `{name_str}` with the tunable values in `config` (unset ones take their first declared value).");
    let doc_mod = format!(
        "Launch metadata and entry point of the `{name_str}` kernel (generated by `#[kernel]`)."
    );
    let helper_mod = format_ident!("{}", name);
    quote! {
        #[doc = #doc_mod]
        #[allow(non_snake_case, clippy::all)]
        #vis mod #helper_mod {
            #[allow(unused_imports)]
            use super::*;

            #meta

            #[doc = #doc_launch]
            #[allow(clippy::too_many_arguments, unreachable_patterns)]
            pub fn launch<#gen_params>(
                __launcher: &::dsl_core::Launcher,
                __config: &::dsl_core::Config,
                #(#params),*
            ) -> ::core::result::Result<::dsl_core::Launch, ::dsl_core::SimError> #where_clause {
                // `__`-prefixed names: the kernel's parameters may be called anything else.
                let __config = META.resolve(__config)?;
                match (#(#getters,)*) {
                    #(#arms)*
                    _ => ::core::unreachable!("a resolved config lies in the declared tunable space"),
                }
            }
        }
    }
}
