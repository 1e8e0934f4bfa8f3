// Runs graph.html's script on a minimal DOM stub.
// node page_smoke.js PAGE                      -> {all, err, un, details, legend, bands}
// node page_smoke.js PAGE match DEV_ID BENCH_ID -> also picks both nodes, matches them, exports
const fs=require('fs');const html=fs.readFileSync(process.argv[2],'utf8');
const data=html.split('id="graph-data">')[1].split('</script>')[0];
const js=html.split('<script>')[1].split('</script>')[0];
function mk(tag){return {tag,children:[],dataset:{},className:'',value:'',textContent:'',style:{},disabled:false,
 appendChild(c){this.children.push(c);return c},replaceChildren(...c){this.children=c},
 addEventListener(ev,f){this['on'+ev]=f},querySelector(){return null},scrollIntoView(){}};}
const els={};
const byId=(id)=>{if(id==='graph-data')return {textContent:data};if(!els[id]){els[id]=mk('div');els[id].id=id;}return els[id];};
byId('filter').value='all';byId('colour').value='index';
global.document={getElementById:byId,createElement:mk,createTextNode:(t)=>Object.assign(mk('#text'),{textContent:String(t)})};
eval(js+';global.__N=N;global.__G=G;global.__select=select;');
const count=(e)=>1+e.children.reduce((a,c)=>a+count(c),0);
const texts=(e)=>[e.textContent].concat(...e.children.map(texts));
const find=(e,pred)=>pred(e)?e:e.children.reduce((a,c)=>a||find(c,pred),null);
const out={};
out.legend=texts(els.legend).filter(Boolean);
out.bands=[];(function walk(e){if(e.dataset&&e.dataset.band!==undefined)out.bands.push([e.dataset.band,e.style.background]);e.children.forEach(walk);})(els.tree);
out.all=count(els.tree);
els.filter.value="error";els.filter.onchange();out.err=count(els.tree);
els.filter.value="unmatched";els.filter.onchange();out.un=count(els.tree);
els.filter.value="all";els.filter.onchange();
els.gorc.onclick();out.details=count(els.info);
if(process.argv[3]==='match'){
 const [dev,bench]=[process.argv[4],process.argv[5]];
 for(const id of [dev,bench]){__select(id);const b=find(els.info,(e)=>e.id==='pickbtn');if(!b)throw new Error('no pick button for '+id);b.onclick();}
 out.picked=els.picked.textContent;out.can_match=!els.domatch.disabled;
 els.domatch.onclick();
 out.node=__N[dev];out.bench_gone=!(bench in __N);out.root_unmatched=__N[__G.root].n_unmatched;
 els.export.onclick();
 const ta=find(els.info,(e)=>e.id==='matchjson');out.exported=ta?ta.value:null;
}
console.log(JSON.stringify(out));
